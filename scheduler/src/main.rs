//! `grove`: the daemon and CLI. The daemon, its public gRPC API and the CLI
//! commands arrive with the daemon issue; today the binary only reports its
//! version, so the workspace layout is the real one.
fn main() {
    let arg = std::env::args().nth(1);
    match arg.as_deref() {
        None | Some("--version") | Some("version") => {
            println!("grove {}", env!("CARGO_PKG_VERSION"))
        }
        Some(other) => {
            eprintln!("grove: {other:?} is not available yet; use grove-runner generate");
            std::process::exit(2);
        }
    }
}
