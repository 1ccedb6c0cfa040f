//! Gives the runner's binaries and tests a RUNPATH (macOS: an LC_RPATH) to
//! the directory holding libmlx, so they start without LD_LIBRARY_PATH. RUNPATH (not the old RPATH)
//! is searched after LD_LIBRARY_PATH, so another libmlx.so (e.g. the CUDA
//! backend's) can still be swapped in without relinking.
fn main() {
    println!("cargo:rerun-if-env-changed=GROVE_MLX_RUNTIME_LIB");
    let target_os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if target_os == "macos" {
        // libmlx.dylib is `@rpath/libmlx.dylib`: an LC_RPATH to the
        // mlx-metal wheel's lib/ (mlx.metallib sits beside it).
        if let Ok(dir) = std::env::var("DEP_MLX_LIB_DIR") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
        return;
    }
    let dirs = [
        std::env::var("GROVE_MLX_RUNTIME_LIB").ok(),
        std::env::var("DEP_MLX_LIB_DIR").ok(),
        // OpenBLAS, which libmlx.so's float products are bound to (mlx-link).
        std::env::var("DEP_MLX_BLAS_DIR").ok(),
    ];
    for dir in dirs.into_iter().flatten() {
        println!("cargo:rustc-link-arg=-Wl,--enable-new-dtags,-rpath,{dir}");
    }
}
