//! The CLI's connection to the daemon, starting one in the background when
//! none answers.
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use grove_proto::v1 as pb;
use grove_proto::v1::grove_client::GroveClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

/// The CLI's client: every call carries GROVE_API_KEY when it is set.
pub type Client = GroveClient<InterceptedService<Channel, ApiKey>>;

/// Adds `authorization: Bearer KEY` to every call.
#[derive(Clone)]
pub struct ApiKey(Option<MetadataValue<tonic::metadata::Ascii>>);

impl ApiKey {
    fn from_env() -> Result<Self> {
        match std::env::var("GROVE_API_KEY") {
            Ok(k) if !k.trim().is_empty() => Ok(Self(Some(
                format!("Bearer {}", k.trim())
                    .parse()
                    .context("GROVE_API_KEY must be printable ASCII")?,
            ))),
            _ => Ok(Self(None)),
        }
    }
}

impl Interceptor for ApiKey {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Connects to the daemon at `addr`, if one answers.
pub async fn connect(addr: SocketAddr) -> Result<Client> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(1))
        .connect()
        .await?;
    let mut client = GroveClient::with_interceptor(channel, ApiKey::from_env()?);
    client.version(pb::VersionRequest {}).await?;
    Ok(client)
}

/// Connects to the daemon, starting `grove serve` in the background first if
/// none answers. With GROVE_NO_AUTOSTART=1 it only waits (up to 30 s) for one
/// that is starting elsewhere.
pub async fn connect_or_start(addr: SocketAddr) -> Result<Client> {
    if let Ok(client) = connect(addr).await {
        return Ok(client);
    }
    if std::env::var("GROVE_NO_AUTOSTART").is_ok_and(|v| v == "1") {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Ok(client) = connect(addr).await {
                return Ok(client);
            }
        }
        bail!("no daemon answered on {addr} within 30 s (GROVE_NO_AUTOSTART=1)");
    }
    let exe = std::env::current_exe().context("finding the grove binary")?;
    let log_path = std::env::temp_dir().join("grove-serve.log");
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    eprintln!(
        "grove: starting the daemon on {addr} (log: {})",
        log_path.display()
    );
    std::process::Command::new(exe)
        .arg("serve")
        .env("GROVE_HOST", addr.to_string())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .context("starting grove serve")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(client) = connect(addr).await {
            return Ok(client);
        }
        if Instant::now() > deadline {
            bail!(
                "the daemon did not answer on {addr} within 30 s; see {}",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
