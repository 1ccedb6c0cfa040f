//! The MLX wheels installed beside a runner that pip installed.
//!
//! `grove-llm` depends on `mlx-cpu` and `grove-llm-cuda` on `mlx-cuda-13`;
//! both MLX wheels write the same `mlx/lib/libmlx.so`, so an environment
//! holding both runs on whichever was written last (packaging/build_wheel.py
//! says why there are two distributions). The daemon says so at start
//! rather than leave a user wondering why a GPU sits idle.
use std::path::{Path, PathBuf};

/// The MLX backend wheels, by the prefix of their `.dist-info` folder.
const BACKENDS: [(&str, &str); 3] = [
    ("mlx_cpu-", "mlx-cpu"),
    ("mlx_cuda_13-", "mlx-cuda-13"),
    ("mlx_cuda_12-", "mlx-cuda-12"),
];

/// The site-packages folders a runner at `runner` loads libmlx from, as its
/// RUNPATH names them: `BIN/../lib/pythonX.Y/{site,dist}-packages` (an
/// environment) and `BIN/..` (`pip install --target`).
fn site_dirs(runner: &Path) -> Vec<PathBuf> {
    let Some(prefix) = runner.parent().and_then(Path::parent) else {
        return Vec::new();
    };
    let mut dirs = vec![prefix.to_owned()];
    if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("python") {
                dirs.push(e.path().join("site-packages"));
                dirs.push(e.path().join("dist-packages"));
            }
        }
    }
    dirs
}

/// A warning when one site-packages folder beside `runner` holds more than
/// one MLX backend wheel; `None` otherwise (a source build among them).
pub fn conflict(runner: &Path) -> Option<String> {
    for dir in site_dirs(runner) {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".dist-info"))
            .collect();
        let found: Vec<&str> = BACKENDS
            .iter()
            .filter(|(prefix, _)| names.iter().any(|n| n.starts_with(prefix)))
            .map(|&(_, name)| name)
            .collect();
        if found.len() > 1 {
            return Some(format!(
                "{} holds {}, which write the same mlx/lib/libmlx.so: the runner gets \
                 whichever was installed last. grove-llm (CPU) and grove-llm-cuda \
                 belong in separate environments",
                dir.display(),
                found.join(" and ")
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(dist_infos: &[&str]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tempdir");
        let site = tmp.path().join("lib/python3.12/site-packages");
        std::fs::create_dir_all(tmp.path().join("bin")).expect("bin");
        for d in dist_infos {
            std::fs::create_dir_all(site.join(d)).expect("dist-info");
        }
        tmp
    }

    #[test]
    fn two_backends_in_one_environment_are_named() {
        let env = layout(&[
            "mlx_cpu-0.32.2.dist-info",
            "mlx_cuda_13-0.32.2.dist-info",
            "grove_llm-0.1.0.dist-info",
        ]);
        let warning = conflict(&env.path().join("bin/grove-runner")).expect("a warning");
        assert!(warning.contains("mlx-cpu and mlx-cuda-13"), "{warning}");
        assert!(warning.contains("site-packages"), "{warning}");
    }

    #[test]
    fn one_backend_or_a_source_build_is_quiet() {
        for infos in [
            &["mlx_cpu-0.32.2.dist-info"][..],
            &[
                "mlx_cuda_13-0.32.2.dist-info",
                "nvidia_cublas-13.1.0.3.dist-info",
            ][..],
            &[][..],
        ] {
            let env = layout(infos);
            assert_eq!(
                conflict(&env.path().join("bin/grove-runner")),
                None,
                "{infos:?}"
            );
        }
        assert_eq!(conflict(Path::new("grove-runner")), None);
    }

    #[test]
    fn pip_install_target_is_looked_at_too() {
        let tmp = tempfile::tempdir().expect("tempdir");
        for d in [
            "bin",
            "mlx_cpu-0.32.2.dist-info",
            "mlx_cuda_12-0.32.2.dist-info",
        ] {
            std::fs::create_dir_all(tmp.path().join(d)).expect("dir");
        }
        let warning = conflict(&tmp.path().join("bin/grove-runner")).expect("a warning");
        assert!(warning.contains("mlx-cpu and mlx-cuda-12"), "{warning}");
    }
}
