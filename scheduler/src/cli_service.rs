//! `grove service install|uninstall|status`.
use anyhow::Result;

use crate::cli::{PlatformArg, ServiceAction};
use crate::service::{self, Platform, ServiceSpec};

/// Runs a `grove service` action.
pub fn run(action: ServiceAction) -> Result<()> {
    let spec = ServiceSpec::from_current_process()?;
    match action {
        ServiceAction::Install { print, platform } => {
            let platform = match platform {
                Some(PlatformArg::Macos) => Platform::MacOs,
                Some(PlatformArg::Linux) => Platform::Linux,
                None => Platform::current()?,
            };
            if print {
                print!("{}", service::render(platform, &spec));
                return Ok(());
            }
            let path = service::install(platform, &spec)?;
            println!("installed and started {}", path.display());
        }
        ServiceAction::Uninstall => {
            service::uninstall(Platform::current()?, &spec)?;
            println!("uninstalled");
        }
        ServiceAction::Status => println!("{}", service::status(Platform::current()?, &spec)?),
    }
    Ok(())
}
