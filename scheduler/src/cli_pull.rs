//! `grove pull MODEL`: the daemon's Pull stream drawn as progress bars.
use anyhow::{Result, bail};
use grove_proto::v1 as pb;

use crate::pull_rpc::from_message;
use crate::store::ProgressBar;

/// Pulls `model` through the daemon, showing its progress on stderr.
pub async fn pull(mut client: crate::cli::client::Client, model: &str) -> Result<()> {
    let mut stream = client
        .pull(pb::PullRequest {
            model: model.to_owned(),
        })
        .await
        .map_err(|s| anyhow::anyhow!("{}", s.message()))?
        .into_inner();
    let mut bar = ProgressBar::stderr();
    loop {
        match stream.message().await {
            Ok(Some(m)) => {
                if let Some(p) = from_message(&m) {
                    bar.update(&p);
                }
                if m.stage == pb::PullStage::Done as i32 {
                    return Ok(());
                }
            }
            Ok(None) => bail!("the pull ended without finishing"),
            Err(s) => bail!("{}", s.message()),
        }
    }
}
