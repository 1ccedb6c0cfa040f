//! `grove serve`: the gRPC daemon. Binds loopback unless told otherwise, serves
//! `grove.v1.Grove` plus gRPC health and reflection, and on shutdown ends
//! in-flight streams, stops every runner and removes their sockets.
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use grove_proto::v1::grove_server::GroveServer;

use crate::api::Api;
use crate::config::DaemonConfig;
use crate::sched::{SchedConfig, Scheduler};
use crate::store::{OllamaStore, Store};

/// Why the daemon stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(
        "refusing to listen on {0}, which is not a loopback address: anyone who can reach it could use \
         your models. Set GROVE_ALLOW_REMOTE=1 to allow it."
    )]
    NotLoopback(std::net::SocketAddr),
    #[error(
        "refusing to listen on {0} without an API key: set GROVE_API_KEY, which every client must then send \
         as `Authorization: Bearer KEY`"
    )]
    NoApiKey(std::net::SocketAddr),
    #[error("creating the runners' socket directory: {0}")]
    SocketDir(std::io::Error),
    #[error("the model store: {0}")]
    Store(String),
    #[error("reflection: {0}")]
    Reflection(String),
    #[error("serving on {addr}: {source}")]
    Serve {
        addr: std::net::SocketAddr,
        source: tonic::transport::Error,
    },
}

/// How long in-flight streams get to end after the runners are stopped.
const GRACE: Duration = Duration::from_secs(3);

/// Serves until `shutdown` resolves.
pub async fn run(
    config: DaemonConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), DaemonError> {
    if !config.host.ip().is_loopback() {
        if !config.allow_remote {
            return Err(DaemonError::NotLoopback(config.host));
        }
        if config.http.api_key.is_none() {
            return Err(DaemonError::NoApiKey(config.host));
        }
        eprintln!(
            "grove: WARNING: listening on {}, reachable from other machines",
            config.host
        );
    }
    if let Some(warning) = crate::mlx_wheels::conflict(&config.runner_bin) {
        eprintln!("grove: WARNING: {warning}");
    }
    crate::runner_proc::remove_stale_socket_dirs();
    let sockets = tempfile::Builder::new()
        .prefix(crate::runner_proc::SOCKET_DIR_PREFIX)
        .tempdir()
        .map_err(DaemonError::SocketDir)?;
    crate::runner_proc::claim_socket_dir(sockets.path()).map_err(DaemonError::SocketDir)?;
    let sched = Scheduler::start(SchedConfig {
        runner_bin: config.runner_bin.clone(),
        socket_dir: sockets.path().to_owned(),
        keep_alive: config.keep_alive,
        max_loaded: config.max_loaded,
        max_queue: config.max_queue,
        load_timeout: config.load_timeout,
        runner_timeout: config.runner_timeout,
        memory_budget: config.memory_budget,
        context_length: config.context_length,
        shards: config.shards,
        per_device: config.per_device,
    });
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<GroveServer<Api>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(grove_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| DaemonError::Reflection(e.to_string()))?;
    let store = Store::from_env().map_err(|e| DaemonError::Store(e.to_string()))?;
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let api = Arc::new(Api {
        sched: sched.clone(),
        store,
        ollama: OllamaStore::from_env(),
        closing,
        responses: crate::http::responses::ResponseStore::start(),
    });
    eprintln!(
        "grove: listening on {} (budget {} MiB, up to {} models, keep_alive {:?})",
        config.host,
        config.memory_budget >> 20,
        config.max_loaded,
        config.keep_alive
    );
    let (fired_tx, mut fired) = tokio::sync::watch::channel(false);
    let stopping = {
        let sched = sched.clone();
        async move {
            shutdown.await;
            eprintln!("grove: shutting down: stopping runners");
            // In-flight streams end with a status now, then the runners stop.
            let _ = closing_tx.send(true);
            sched.shutdown().await;
            let _ = fired_tx.send(true);
        }
    };
    // One router: gRPC by its paths (/grove.v1.Grove/...), HTTP by its own
    // (/v1/..., /api/...); HTTP/1.1 for the JSON clients, h2 for both.
    let grpc = tonic::service::Routes::new(health_service)
        .add_service(reflection)
        .add_service(GroveServer::from_arc(api.clone()))
        .into_axum_router();
    let router = crate::http::with_auth(
        grpc.merge(crate::http::routes(api, &config.http)),
        config.http.api_key.clone(),
    );
    let serve = tonic::transport::Server::builder()
        .accept_http1(true)
        .add_routes(tonic::service::Routes::from(router))
        .serve_with_shutdown(config.host, stopping);
    let deadline = async move {
        let _ = fired.wait_for(|f| *f).await;
        tokio::time::sleep(GRACE).await;
    };
    let result = tokio::select! {
        r = serve => r.map_err(|source| DaemonError::Serve { addr: config.host, source }),
        _ = deadline => Ok(()),
    };
    drop(sockets);
    result
}
