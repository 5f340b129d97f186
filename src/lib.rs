//! idemgate: a webhook de-duplication sidecar. See README.md and docs/.
//!
//! A delivery flows route → verify → identify → claim → forward → settle; each step
//! lives in its own module (see `gate` for the pipeline itself). The modules are grouped
//! by layer, lowest first: a module names only modules of its own or lower layers
//! (`tests/it/layering.rs` checks it).
//!
//! Public are the layers the binary, the benches and the integration tests build on;
//! the operator side and the wiring are private, with their entry points re-exported.

// Serving one connection, for every listener (names no other module).
mod conn;

// Leaves: configuration, the upstream client, logging, manifest injection.
pub mod config;
mod inject;
pub mod logging;
pub mod upstream;

// Built from the configuration: the providers' routes, the metrics, tracing.
pub mod metrics;
pub mod providers;
pub mod trace;

// The claim and the delivery log.
pub mod store;

// Every answer's shape.
mod answer;

// Async mode's queue.
pub mod queue;

// The delivery pipeline.
pub mod gate;

// The operator's side: delivery log actions, the web console, probes.
mod deliveries;
mod probes;
mod reload;
mod web;

// The wiring.
mod app;
mod demo;
pub mod server;

pub use answer::retry_after_secs;
pub use deliveries::cli::{DeliveriesArgs, main as deliveries_main};
pub use deliveries::ops_cli::{JobsArgs, RoutesArgs, jobs_main, routes_main};
pub use demo::run as run_demo;
pub use inject::injector::{InjectorArgs, run as run_injector};
pub use inject::{InjectArgs, main as inject_main};
pub use reload::cli::{ReloadArgs, main as reload_main, show_running as show_running_config};
