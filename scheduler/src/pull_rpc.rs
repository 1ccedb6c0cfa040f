//! The daemon's `Pull` stream: [`store::pull`](crate::store::pull) with its
//! progress events carried as `grove.v1.PullProgress` messages, and back.
use std::path::PathBuf;
use std::pin::Pin;
use std::time::Duration;

use grove_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use crate::store::hub::endpoint_url;
use crate::store::{
    HubToken, ModelRef, Progress, PullOptions, Store, StoreError, pull as store_pull,
};

/// A progress event as a message.
pub fn to_message(p: &Progress) -> pb::PullProgress {
    use pb::PullStage as S;
    let mut m = pb::PullProgress::default();
    match p {
        Progress::Resolved {
            name,
            commit,
            files,
            total_bytes,
            cached_bytes,
        } => {
            m.stage = S::Resolved as i32;
            m.name = name.clone();
            m.commit = commit.clone();
            m.files = *files as u32;
            m.total_bytes = *total_bytes;
            m.completed_bytes = *cached_bytes;
        }
        Progress::FileWaiting { file } => {
            m.stage = S::FileWaiting as i32;
            m.file = file.clone();
        }
        Progress::FileStart {
            file,
            size,
            resumed_from,
        } => {
            m.stage = S::FileStart as i32;
            m.file = file.clone();
            m.total_bytes = *size;
            m.resumed_from = *resumed_from;
        }
        Progress::FileBytes { file, done, size } => {
            m.stage = S::FileBytes as i32;
            m.file = file.clone();
            m.completed_bytes = *done;
            m.total_bytes = *size;
        }
        Progress::FileVerifying { file } => {
            m.stage = S::FileVerifying as i32;
            m.file = file.clone();
        }
        Progress::FileDone {
            file,
            size,
            downloaded,
            cached,
        } => {
            m.stage = S::FileDone as i32;
            m.file = file.clone();
            m.total_bytes = *size;
            m.downloaded_bytes = *downloaded;
            m.cached = *cached;
        }
        Progress::Done {
            commit,
            path,
            downloaded_bytes,
            total_bytes,
            elapsed,
        } => {
            m.stage = S::Done as i32;
            m.commit = commit.clone();
            m.path = path.display().to_string();
            m.downloaded_bytes = *downloaded_bytes;
            m.total_bytes = *total_bytes;
            m.elapsed_ns = elapsed.as_nanos() as u64;
        }
    }
    m
}

/// A message as a progress event (None for an unknown stage).
pub fn from_message(m: &pb::PullProgress) -> Option<Progress> {
    use pb::PullStage as S;
    Some(match S::try_from(m.stage).ok()? {
        S::Resolved => Progress::Resolved {
            name: m.name.clone(),
            commit: m.commit.clone(),
            files: m.files as usize,
            total_bytes: m.total_bytes,
            cached_bytes: m.completed_bytes,
        },
        S::FileWaiting => Progress::FileWaiting {
            file: m.file.clone(),
        },
        S::FileStart => Progress::FileStart {
            file: m.file.clone(),
            size: m.total_bytes,
            resumed_from: m.resumed_from,
        },
        S::FileBytes => Progress::FileBytes {
            file: m.file.clone(),
            done: m.completed_bytes,
            size: m.total_bytes,
        },
        S::FileVerifying => Progress::FileVerifying {
            file: m.file.clone(),
        },
        S::FileDone => Progress::FileDone {
            file: m.file.clone(),
            size: m.total_bytes,
            downloaded: m.downloaded_bytes,
            cached: m.cached,
        },
        S::Done => Progress::Done {
            commit: m.commit.clone(),
            path: PathBuf::from(&m.path),
            downloaded_bytes: m.downloaded_bytes,
            total_bytes: m.total_bytes,
            elapsed: Duration::from_nanos(m.elapsed_ns),
        },
        S::Unspecified => return None,
    })
}

fn store_status(e: StoreError) -> Status {
    Status::unavailable(e.to_string())
}

/// The daemon's own hub settings (its environment) with the client's
/// `hub` laid over them, for one pull. An endpoint is checked here, so that
/// a bad one is refused before the stream starts.
pub fn pull_options(hub: Option<&pb::HubSettings>) -> Result<PullOptions, Status> {
    let mut opts = PullOptions::from_env();
    let Some(hub) = hub else {
        return Ok(opts);
    };
    if let Some(endpoint) = &hub.endpoint {
        let endpoint = endpoint.trim().trim_end_matches('/');
        endpoint_url(endpoint).map_err(|e| Status::invalid_argument(e.to_string()))?;
        opts.endpoint = endpoint.to_string();
    }
    if let Some(token) = &hub.token {
        // An empty token asks for none (a public repo, whatever the daemon has).
        opts.token = HubToken::new(token);
    }
    if let Some(offline) = hub.offline {
        opts.offline = offline;
    }
    Ok(opts)
}

/// Starts pulling `model` into `store` with the client's `hub` settings
/// (unset ones are the daemon's); progress streams back, the last message
/// is DONE, and a failure ends the stream with a status.
pub async fn pull(
    store: Store,
    model: String,
    hub: Option<pb::HubSettings>,
) -> Result<Pin<Box<dyn Stream<Item = Result<pb::PullProgress, Status>> + Send>>, Status> {
    let name = match ModelRef::parse(&model).map_err(|e| Status::invalid_argument(e.to_string()))? {
        ModelRef::Repo(name) => name,
        ModelRef::Path(_) | ModelRef::Ollama(_) => {
            return Err(Status::invalid_argument(
                "grove pull takes a Hugging Face repo id, ORG/NAME",
            ));
        }
    };
    let opts = pull_options(hub.as_ref())?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(async move {
        let (ptx, mut prx) = mpsc::channel::<Progress>(64);
        let forward = {
            let tx = tx.clone();
            async move {
                while let Some(p) = prx.recv().await {
                    if tx.send(Ok(to_message(&p))).await.is_err() {
                        return; // the client left; the pull goes on to completion
                    }
                }
            }
        };
        let (result, ()) = tokio::join!(store_pull(&store, &name, &opts, ptx), forward);
        if let Err(e) = result {
            let _ = tx.send(Err(store_status(e))).await;
        }
    });
    Ok(Box::pin(ReceiverStream::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clients_settings_lie_over_the_daemons() {
        let daemon = PullOptions::from_env();
        // Nothing sent: the daemon's own.
        let o = pull_options(None).expect("options");
        assert_eq!(o.endpoint, daemon.endpoint);
        assert_eq!(o.offline, daemon.offline);
        let hub = pb::HubSettings {
            endpoint: Some("http://127.0.0.1:9/".into()),
            token: Some("hf_client".into()),
            offline: Some(!daemon.offline),
        };
        let o = pull_options(Some(&hub)).expect("options");
        assert_eq!(o.endpoint, "http://127.0.0.1:9");
        assert_eq!(o.token, HubToken::new("hf_client"));
        assert_eq!(o.offline, !daemon.offline);
        // Only the endpoint: the rest stays the daemon's.
        let o = pull_options(Some(&pb::HubSettings {
            endpoint: Some("https://hub.example".into()),
            ..Default::default()
        }))
        .expect("options");
        assert_eq!((o.token, o.offline), (daemon.token, daemon.offline));
        // An empty token asks for none.
        let o = pull_options(Some(&pb::HubSettings {
            token: Some(String::new()),
            ..Default::default()
        }))
        .expect("options");
        assert_eq!(o.token, None);
        for bad in ["ftp://x", "not a url"] {
            let e = pull_options(Some(&pb::HubSettings {
                endpoint: Some(bad.into()),
                ..Default::default()
            }))
            .expect_err(bad);
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}");
        }
    }
}
