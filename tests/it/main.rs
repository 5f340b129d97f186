//! idemgate's integration tests, as one test binary: the harness in `common/` is
//! compiled and linked once instead of once per file, and each file below is a module.
//! Run one file's tests with `cargo test --test it <module>::`, e.g.
//! `cargo test --test it e2e_admin::`.

mod common;

mod e2e_admin;
mod e2e_admin_cluster;
mod e2e_admin_roundtrips;
mod e2e_answers;
mod e2e_async;
mod e2e_cli_deliveries;
mod e2e_cluster;
mod e2e_concurrency;
mod e2e_console;
mod e2e_console_ops;
mod e2e_faults;
mod e2e_file_store;
mod e2e_file_store_disk;
mod e2e_harness;
mod e2e_hostile;
mod e2e_hostile_listeners;
mod e2e_injector;
mod e2e_jobs;
mod e2e_jobs_start;
mod e2e_lease_lost;
mod e2e_log_fields;
mod e2e_memory_store;
mod e2e_presets_a;
mod e2e_presets_b;
mod e2e_protect;
mod e2e_providers;
mod e2e_reload;
mod e2e_reload_lifetimes;
mod e2e_reload_log;
mod e2e_reload_storm;
mod e2e_reload_tracing;
mod e2e_roundtrips;
mod e2e_route_dedup;
mod e2e_runtimes;
mod e2e_sentinel_auth;
mod e2e_short_secrets;
mod e2e_soak;
mod e2e_tls;
mod e2e_tracing;
mod e2e_upstream_conns;
mod inject;
mod layering;
mod pacing_conformance;
mod props;
mod queue_conformance;
mod redis_records;
mod settle_conformance;
mod store_conformance;
mod store_log_conformance;
