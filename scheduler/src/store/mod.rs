//! The model store: the Hugging Face hub cache, shared with mlx-lm and
//! `huggingface_hub`, and `pull` from the hub into it.
//!
//! - [`name`]: `ORG/NAME[@REVISION]` with the hub's rules, or a local
//!   directory ([`ModelRef`]); bad names are rejected before any file access.
//! - [`cache`]: the cache layout (`HF_HUB_CACHE`, `$HF_HOME/hub`,
//!   `~/.cache/huggingface/hub`): resolving a name to a snapshot directory,
//!   listing, removing ([`Store`]).
//! - [`ollama`]: models pulled by ollama, listed and read in place.
//! - [`import`]: a converted GGUF directory added to the cache as a local
//!   snapshot.
//! - [`hub`]: the hub's HTTP protocol (`HF_ENDPOINT`, `HF_TOKEN`).
//! - [`pull`](mod@pull): downloading the files a runner needs, resumable, verified,
//!   with [`Progress`] events; [`fetch`] is one blob's download.
//! - [`snapshot`]: what a snapshot holds and lacks.
//! - [`progress`]: the CLI's progress bar over those events.
//! - [`error`]: [`StoreError`], naming the phase and what to do.
//!
//! ```no_run
//! # async fn demo() -> Result<(), grove::store::StoreError> {
//! use grove::store::{ModelName, ProgressBar, PullOptions, Store, pull};
//! let store = Store::from_env()?;
//! let name = ModelName::parse("mlx-community/Qwen3-0.6B-4bit")?;
//! let (tx, mut rx) = tokio::sync::mpsc::channel(64);
//! let show = tokio::spawn(async move {
//!     let mut bar = ProgressBar::stderr();
//!     while let Some(p) = rx.recv().await {
//!         bar.update(&p);
//!     }
//! });
//! let dir = pull(&store, &name, &PullOptions::from_env(), tx).await?;
//! let _ = show.await;
//! println!("{}", dir.display());
//! # Ok(()) }
//! ```
pub mod cache;
pub mod error;
pub mod fetch;
pub mod hub;
pub mod import;
pub mod name;
pub mod ollama;
pub mod progress;
pub mod pull;
pub mod snapshot;

pub use cache::{LocalModel, RemoveReport, Store};
pub use error::{Phase, StoreError};
pub use hub::{HubClient, HubToken};
pub use name::{ModelName, ModelRef};
pub use ollama::{OllamaName, OllamaStore};
pub use progress::ProgressBar;
pub use pull::{Progress, PullOptions, pull, truthy};
