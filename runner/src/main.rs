//! `grove-runner`: see the library's `cli` module.
use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = grove_runner::cli::Cli::parse();
    if matches!(cli.command, grove_runner::cli::Command::Render) {
        return grove_runner::chat_template::sandbox::worker();
    }
    match grove_runner::cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grove-runner: error: {e}");
            ExitCode::FAILURE
        }
    }
}
