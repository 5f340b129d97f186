//! idemgate: a webhook de-duplication sidecar. See README.md and docs/.
//!
//! A delivery flows route → verify → identify → claim → forward → settle; each step
//! lives in its own module (see `gate` for the pipeline itself).

pub mod answer;
pub mod app;
pub mod config;
pub mod deliveries;
pub mod demo;
pub mod gate;
pub mod inject;
pub mod logging;
pub mod metrics;
pub mod probes;
pub mod providers;
pub mod queue;
pub mod server;
pub mod store;
pub mod upstream;
pub mod web;
