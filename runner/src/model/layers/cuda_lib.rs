//! `libgrove_cuda.so`, the library of Grove's own CUDA kernels (the decode
//! step, `cuda_decode.rs`), opened once with `dlopen` when MLX's device is a
//! CUDA GPU: the runner itself links no CUDA.
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

use super::cuda_decode::{FastDims, MatIn};
use super::cuda_qmv::on_cuda_gpu;

pub(crate) type NewFn = unsafe extern "C" fn(
    *const FastDims,
    *const MatIn,
    c_int,
    *const *mut c_void,
    c_int,
    *mut *mut c_void,
) -> c_int;
pub(crate) type StepFn = unsafe extern "C" fn(
    *mut c_void,
    *mut c_void,
    *mut c_void,
    *const *mut c_void,
    c_int,
    *const c_int,
    *mut *mut c_void,
) -> c_int;
pub(crate) type FreeFn = unsafe extern "C" fn(*mut c_void);
pub(crate) type ErrorFn = unsafe extern "C" fn() -> *const c_char;
pub(crate) type PickFn = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> c_int;

pub(crate) struct Lib {
    pub new: NewFn,
    pub step: StepFn,
    pub free: FreeFn,
    error: ErrorFn,
    /// The greedy pick (`cuda_pick.rs`); `None` in a library built before it.
    pub pick: Option<PickFn>,
}

impl Lib {
    pub fn last_error(&self) -> String {
        // SAFETY: returns a pointer to a thread-local NUL-terminated string.
        unsafe { CStr::from_ptr((self.error)()) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether the step is wanted: a CUDA GPU and not `GROVE_FAST_DECODE=0`.
pub fn wanted() -> bool {
    std::env::var("GROVE_FAST_DECODE").as_deref() != Ok("0") && on_cuda_gpu()
}

/// Where the library is: `GROVE_CUDA_DECODE_LIB`, else `libgrove_cuda.so`
/// beside the runner (a source build), else the bare name, which `dlopen`
/// looks up along the runner's RUNPATH (the `grove-llm-cuda` wheel puts it in
/// `site-packages/grove_llm_cuda/`, a directory of that RUNPATH).
fn library_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("GROVE_CUDA_DECODE_LIB") {
        return p.into();
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join(LIB_NAME)));
    match beside {
        Some(p) if p.is_file() => p,
        _ => LIB_NAME.into(),
    }
}

const LIB_NAME: &str = "libgrove_cuda.so";

/// The library, opened once (`None`, said once on stderr, when it cannot be).
pub(crate) fn lib() -> Option<&'static Lib> {
    static LIB: OnceLock<Option<Lib>> = OnceLock::new();
    LIB.get_or_init(|| {
        let path = library_path();
        let open = || -> Result<Lib, String> {
            let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| e.to_string())?;
            // SAFETY: dlopen/dlsym with valid C strings; the handle is never
            // closed, so the symbols stay valid for the process.
            unsafe {
                let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
                if h.is_null() {
                    let e = libc::dlerror();
                    return Err(if e.is_null() {
                        "dlopen failed".into()
                    } else {
                        CStr::from_ptr(e).to_string_lossy().into_owned()
                    });
                }
                let sym = |name: &CStr| {
                    let p = libc::dlsym(h, name.as_ptr());
                    if p.is_null() {
                        Err(format!("no symbol {name:?}"))
                    } else {
                        Ok(p)
                    }
                };
                Ok(Lib {
                    new: std::mem::transmute::<*mut c_void, NewFn>(sym(c"grove_fd_new")?),
                    step: std::mem::transmute::<*mut c_void, StepFn>(sym(c"grove_fd_step")?),
                    free: std::mem::transmute::<*mut c_void, FreeFn>(sym(c"grove_fd_free")?),
                    error: std::mem::transmute::<*mut c_void, ErrorFn>(sym(c"grove_fd_error")?),
                    pick: sym(c"grove_fd_pick")
                        .ok()
                        .map(|p| std::mem::transmute::<*mut c_void, PickFn>(p)),
                })
            }
        };
        match open() {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!(
                    "grove-runner: CUDA decode step unavailable ({}: {e}); decoding with MLX's ops",
                    path.display()
                );
                None
            }
        }
    })
    .as_ref()
}
