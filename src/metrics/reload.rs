//! The live configuration reload's metrics (src/reload, docs/reload.md):
//! what an alert needs to say that the configuration in force is not the one on disk.

use prometheus::{Gauge, IntCounterVec, IntGauge, Opts, Registry};

/// `idemgate_config_*`: reloads by result, and whether and when the last one applied.
pub struct ReloadMetrics {
    /// `idemgate_config_reloads_total{result="ok"|"failed"}`.
    reloads: IntCounterVec,
    /// `idemgate_config_last_reload_successful`: 1 when the last reload applied (or
    /// none was tried since start), 0 when it failed.
    pub last_successful: IntGauge,
    /// `idemgate_config_last_reload_success_timestamp_seconds`: when the configuration
    /// in force was loaded (start, or the last reload that applied).
    pub last_success_timestamp: Gauge,
}

impl ReloadMetrics {
    /// The families registered in `registry`, both results at 0 and the start as the
    /// last successful load.
    pub(super) fn register(registry: &Registry) -> ReloadMetrics {
        let reloads = IntCounterVec::new(
            Opts::new(
                "idemgate_config_reloads_total",
                "Configuration reloads (SIGHUP, a watched file's change, POST /admin/reload) by result: ok (applied) or failed (the configuration in force was kept).",
            ),
            &["result"],
        )
        .expect("valid metric");
        for result in ["ok", "failed"] {
            reloads.with_label_values(&[result]);
        }
        let last_successful = IntGauge::new(
            "idemgate_config_last_reload_successful",
            "1 when the last configuration reload applied (or none was tried), 0 when it failed and an older configuration is in force.",
        )
        .expect("valid metric");
        last_successful.set(1);
        let last_success_timestamp = Gauge::new(
            "idemgate_config_last_reload_success_timestamp_seconds",
            "Unix time at which the configuration in force was loaded (start or the last reload that applied).",
        )
        .expect("valid metric");
        last_success_timestamp.set(unix_now());
        for c in [
            Box::new(reloads.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(last_successful.clone()),
            Box::new(last_success_timestamp.clone()),
        ] {
            registry.register(c).expect("metric registered once");
        }
        ReloadMetrics {
            reloads,
            last_successful,
            last_success_timestamp,
        }
    }

    /// Counts one reload and sets the gauges: `ok` when it applied.
    pub fn record(&self, ok: bool) {
        self.reloads
            .with_label_values(&[if ok { "ok" } else { "failed" }])
            .inc();
        self.last_successful.set(i64::from(ok));
        if ok {
            self.last_success_timestamp.set(unix_now());
        }
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}
