//! `grove pull MODEL`: the daemon's Pull stream drawn as progress bars.
use anyhow::{Result, bail};
use grove_proto::v1 as pb;

use crate::pull_rpc::from_message;
use crate::store::{HubToken, ProgressBar, truthy};

/// The hub settings of this shell that the daemon should use for its pull:
/// `HF_ENDPOINT`, the token (`HF_TOKEN`, else the token file, as
/// `huggingface_hub` finds it) and `HF_HUB_OFFLINE`, each only when set
/// here; what is not set is the daemon's own.
pub fn hub_settings(get: &dyn Fn(&str) -> Option<String>) -> Option<pb::HubSettings> {
    let endpoint = get("HF_ENDPOINT").filter(|e| !e.trim().is_empty());
    let token = HubToken::from_lookup(get).map(|t| t.secret().to_owned());
    let offline = ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]
        .iter()
        .filter_map(|k| get(k))
        .map(|v| truthy(&v))
        .reduce(|a, b| a || b);
    let hub = pb::HubSettings {
        endpoint,
        token,
        offline,
    };
    (hub != pb::HubSettings::default()).then_some(hub)
}

/// Pulls `model` through the daemon with this shell's hub settings, showing
/// its progress on stderr.
pub async fn pull(mut client: crate::cli::client::Client, model: &str) -> Result<()> {
    let mut stream = client
        .pull(pb::PullRequest {
            model: model.to_owned(),
            hub: hub_settings(&|k| std::env::var(k).ok()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())
    }

    #[test]
    fn only_what_the_shell_sets_is_sent() {
        let home = tempfile::tempdir().expect("tempdir");
        let home_s = home.path().display().to_string();
        // Nothing set (and no token file): the daemon's own settings.
        assert_eq!(hub_settings(&lookup(&[("HF_HOME", &home_s)])), None);
        let hub = hub_settings(&lookup(&[
            ("HF_HOME", &home_s),
            ("HF_ENDPOINT", "http://127.0.0.1:9"),
            ("HF_TOKEN", "hf_one"),
            ("HF_HUB_OFFLINE", "0"),
        ]))
        .expect("settings");
        assert_eq!(hub.endpoint.as_deref(), Some("http://127.0.0.1:9"));
        assert_eq!(hub.token.as_deref(), Some("hf_one"));
        assert_eq!(hub.offline, Some(false));
        assert!(!format!("{hub:?}").contains("hf_one"));
        // The token file, as huggingface_hub reads it.
        std::fs::write(home.path().join("token"), "hf_file\n").expect("token file");
        let hub = hub_settings(&lookup(&[("HF_HOME", &home_s)])).expect("settings");
        assert_eq!(hub.token.as_deref(), Some("hf_file"));
        assert_eq!((hub.endpoint, hub.offline), (None, None));
    }
}
