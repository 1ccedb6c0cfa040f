//! Builds mlx-c and generates its Rust bindings.
//!
//! Inputs (set by the Makefile, or by `.cargo/config.toml` for plain `cargo`):
//! - `GROVE_MLX_C_DIR`: mlx-c's sources, unpacked from the registry's mlx-sys 0.7.0
//!   package at set-up time (nothing of it is committed here).
//! - `GROVE_MLX_PREFIX`: an MLX install prefix holding `lib/libmlx.so` (macOS:
//!   `lib/libmlx.dylib` and `lib/mlx.metallib`), `include/` and
//!   `share/cmake/MLX/`, i.e. the `mlx/` folder of the `mlx-cpu` or `mlx-cuda-13`
//!   wheel (Linux) or of the `mlx-metal` wheel (macOS).
//! - `CMAKE`, `LIBCLANG_PATH`: the cmake binary and libclang (both from PyPI).
//!
//! Steps: 1. configure and build mlx-c with CMake; 2. build Grove's CPU
//! quantized-matmul primitive (`cxx/cpu_qmm.cpp`, its kernel once per
//! instruction set) against the same MLX headers; 3. tell rustc what to link;
//! 4. run bindgen over every `mlx/c/*.h`.
use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn required_dir(var: &str, what: &str) -> PathBuf {
    println!("cargo:rerun-if-env-changed={var}");
    let Some(value) = env::var_os(var) else {
        panic!("{var} is not set: it must point at {what}. Run `make setup` first.");
    };
    let path = PathBuf::from(value);
    if !path.is_dir() {
        panic!(
            "{var}={} is not a directory: it must point at {what}. Run `make setup` first.",
            path.display()
        );
    }
    path
}

fn headers(mlx_c: &Path) -> Vec<PathBuf> {
    let dir = mlx_c.join("mlx/c");
    let mut found: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    found.sort();
    found
}

fn main() {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets it"));
    let target_os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let mlx_c = required_dir("GROVE_MLX_C_DIR", "mlx-c's source tree");
    println!("cargo:rerun-if-changed=cxx/compat.h");
    println!("cargo:rerun-if-changed=cxx/bindgen.h");

    // 1. Configure and build mlx-c.
    let mut cfg = cmake::Config::new(&mlx_c);
    cfg.define("MLX_C_BUILD_EXAMPLES", "OFF")
        .define("BUILD_SHARED_LIBS", "OFF")
        // A debug mlx-c only slows every FFI call; nothing of it is debugged here.
        .profile("Release");
    // MLX from its wheel on every platform: `mlx-cpu` or `mlx-cuda-13` on
    // Linux, `mlx-metal` on macOS (libmlx.dylib, mlx.metallib, headers and
    // CMake files in the same layout), so a Mac needs no Xcode Metal compiler.
    let prefix = required_dir(
        "GROVE_MLX_PREFIX",
        "an MLX prefix (the `mlx/` folder of the mlx-cpu, mlx-cuda-13 or mlx-metal wheel)",
    );
    let cmake_dir = prefix.join("share/cmake/MLX");
    if !cmake_dir.join("MLXConfig.cmake").is_file() {
        panic!(
            "{} has no MLXConfig.cmake: GROVE_MLX_PREFIX must be an MLX install prefix",
            cmake_dir.display()
        );
    }
    cfg.define("MLX_C_USE_SYSTEM_MLX", "ON")
        .define("CMAKE_PREFIX_PATH", &prefix)
        .define("MLX_DIR", &cmake_dir);
    if target_os != "macos" {
        let compat = manifest.join("cxx/compat.h");
        cfg.cxxflag(format!("-include {}", compat.display()));
    }
    let lib_dir = prefix.join("lib");
    let dst = cfg.build();

    // 2. Grove's CPU primitive and OpenBLAS (Linux: the CPU backend's).
    println!("cargo::rustc-check-cfg=cfg(grove_cpu_qmm)");
    if target_os != "macos" {
        build_cpu_qmm(&manifest, &mlx_c, &prefix.join("include"));
        println!("cargo:rustc-cfg=grove_cpu_qmm");
        link_openblas(&manifest);
    }

    // 3. Link: the static mlx-c, then MLX itself.
    for sub in ["lib", "lib64", "build"] {
        println!("cargo:rustc-link-search=native={}", dst.join(sub).display());
    }
    println!("cargo:rustc-link-lib=static=mlxc");
    println!("cargo:rustc-link-search=native={}", lib_dir.display());
    println!("cargo:rustc-link-lib=dylib=mlx");
    // libmlx's C++ runtime: libstdc++ on Linux, libc++ on macOS (its
    // frameworks, Metal and Accelerate, are libmlx.dylib's own dependencies).
    let cxx_runtime = if target_os == "macos" {
        "c++"
    } else {
        "stdc++"
    };
    println!("cargo:rustc-link-lib=dylib={cxx_runtime}");
    // Dependents with their own build script read this as DEP_MLX_LIB_DIR.
    println!("cargo:lib_dir={}", lib_dir.display());

    // 4. Bindings.
    let mut builder = bindgen::Builder::default()
        .clang_arg(format!("-I{}", mlx_c.display()))
        .blocklist_type("float16_t")
        .blocklist_type("bfloat16_t")
        .blocklist_function("malloc")
        .blocklist_function("realloc")
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    if target_os != "macos" {
        builder = builder.clang_arg(format!(
            "-include{}",
            manifest.join("cxx/bindgen.h").display()
        ));
    } else if let Some(sdk) = macos_sdk() {
        // The C library's headers come from the Command Line Tools' SDK.
        builder = builder.clang_arg(format!("-isysroot{}", sdk.display()));
    }
    // libclang from PyPI ships no builtin headers (float.h, stddef.h): use the
    // C compiler's.
    if let Some(dir) = compiler_include_dir() {
        builder = builder.clang_arg(format!("-isystem{}", dir.display()));
    }
    for header in headers(&mlx_c) {
        builder = builder.header(header.to_string_lossy());
    }
    let bindings = builder
        .generate()
        .unwrap_or_else(|e| panic!("bindgen failed over {}: {e}", mlx_c.display()));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("writing bindings.rs into OUT_DIR");
}

/// Grove's CPU primitives (`cxx/cpu_qmm.cpp`, `cxx/cpu_fast.cpp`, their
/// threads in `cxx/pool.cpp`) and their kernels (`cxx/qmm_kernel.h`,
/// `cxx/attn_kernel.h`) built once per instruction set, each into its own
/// static library (flags are per build).
fn build_cpu_qmm(manifest: &Path, mlx_c: &Path, mlx_include: &Path) {
    let cxx = manifest.join("cxx");
    for f in [
        "act.h",
        "act_kernel.h",
        "arrays.h",
        "attn.h",
        "attn_kernel.h",
        "cpu_fast.cpp",
        "cpu_qmm.cpp",
        "isa.h",
        "pool.cpp",
        "pool.h",
        "qmm.h",
        "qmm_kernel.h",
        "qmm_base.cpp",
        "qmm_avx2.cpp",
        "qmm_avx512.cpp",
    ] {
        println!("cargo:rerun-if-changed=cxx/{f}");
    }
    // One static library per build: flags are per build, and the entry
    // point (which names the kernels) links before them.
    let compile = |files: &[&str], lib: &str, flags: &[&str], includes: &[&Path]| {
        let mut b = cc::Build::new();
        b.cpp(true)
            .std("c++20")
            .opt_level(3)
            .flag("-ffp-contract=fast")
            // GCC notes (not warns) that 32-byte vector arguments changed ABI in 4.6.
            .flag_if_supported("-Wno-psabi")
            .include(&cxx)
            // GCC's own AVX-512 headers warn under -Wall (`__Y = __Y`), and
            // mlx-c's headers have unused statics.
            .warnings(false)
            .files(files.iter().map(|f| cxx.join(f)));
        for f in flags {
            b.flag(f);
        }
        for i in includes {
            b.include(i);
        }
        b.compile(lib);
    };
    compile(
        &["cpu_qmm.cpp", "cpu_fast.cpp", "pool.cpp"],
        "grove_cpu_qmm",
        &[],
        &[mlx_include, mlx_c],
    );
    compile(&["qmm_base.cpp"], "grove_qmm_base", &[], &[]);
    if env::var("CARGO_CFG_TARGET_ARCH").is_ok_and(|a| a == "x86_64") {
        compile(
            &["qmm_avx2.cpp"],
            "grove_qmm_avx2",
            &["-mavx2", "-mfma", "-mf16c"],
            &[],
        );
        let avx512 = ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mfma", "-mf16c"];
        compile(&["qmm_avx512.cpp"], "grove_qmm_avx512", &avx512, &[]);
    }
}

/// Binds libmlx.so's CBLAS calls to OpenBLAS (`cxx/blas_shim.c`) when
/// `GROVE_OPENBLAS_DIR` holds scipy-openblas32's `libscipy_openblas.so`
/// (the Makefile installs it); without it MLX keeps its bundled netlib BLAS.
/// Dependents read the directory as DEP_MLX_BLAS_DIR (for their RUNPATH).
fn link_openblas(manifest: &Path) {
    println!("cargo:rerun-if-env-changed=GROVE_OPENBLAS_DIR");
    println!("cargo:rerun-if-changed=cxx/blas_shim.c");
    let Some(dir) = env::var_os("GROVE_OPENBLAS_DIR").map(PathBuf::from) else {
        println!("cargo:warning=GROVE_OPENBLAS_DIR is not set: MLX keeps its netlib BLAS");
        return;
    };
    if !dir.join("libscipy_openblas.so").is_file() {
        println!(
            "cargo:warning={} has no libscipy_openblas.so: MLX keeps its netlib BLAS (run `make setup`)",
            dir.display()
        );
        return;
    }
    cc::Build::new()
        .file(manifest.join("cxx/blas_shim.c"))
        .opt_level(2)
        .cargo_metadata(false)
        .compile("grove_blas");
    let out = env::var("OUT_DIR").expect("cargo sets it");
    println!("cargo:rustc-link-search=native={out}");
    // Whole: nothing in Rust names these symbols; libmlx.so does.
    println!("cargo:rustc-link-lib=static:+whole-archive=grove_blas");
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=dylib=scipy_openblas");
    println!("cargo:blas_dir={}", dir.display());
    // This package's own test binary (dependents set their RUNPATH themselves).
    println!(
        "cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{}",
        dir.display()
    );
}

/// The C compiler's own include directory (GCC: `cc -print-file-name=include`;
/// clang, Apple's too: `cc -print-resource-dir` + `/include`).
fn compiler_include_dir() -> Option<PathBuf> {
    let cc = env::var("CC").unwrap_or_else(|_| "cc".into());
    let ask = |arg: &str| -> Option<PathBuf> {
        let output = Command::new(&cc).arg(arg).output().ok()?;
        Some(PathBuf::from(String::from_utf8(output.stdout).ok()?.trim()))
    };
    [
        ask("-print-file-name=include"),
        ask("-print-resource-dir").map(|d| d.join("include")),
    ]
    .into_iter()
    .flatten()
    .find(|dir| dir.join("stddef.h").is_file())
}

/// The macOS SDK of the Command Line Tools (`xcrun --show-sdk-path`).
fn macos_sdk() -> Option<PathBuf> {
    let output = Command::new("xcrun").arg("--show-sdk-path").output().ok()?;
    let dir = PathBuf::from(String::from_utf8(output.stdout).ok()?.trim());
    dir.is_dir().then_some(dir)
}
