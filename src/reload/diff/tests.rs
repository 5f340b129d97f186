//! What a reload refuses and what its log line says, from pairs of configurations.

use super::*;

const S1: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const S2: &str = "whsec_second_secret_0123456789abcdefgh";

fn config(text: &str) -> Config {
    Config::from_toml_with_env(text, |_| None).unwrap()
}

fn route(name: &str, secrets: &[&str], extra: &str) -> String {
    let secrets: Vec<String> = secrets.iter().map(|s| format!("\"{s}\"")).collect();
    format!(
        "\n[[route]]\nname = \"{name}\"\npath = \"/webhooks/{name}\"\nprovider = \"standard\"\nsecrets = [{}]\n{extra}\n",
        secrets.join(", ")
    )
}

#[test]
fn routes_secrets_limits_and_copy_handling_change_without_a_restart() {
    let old = config(&(route("a", &[S1], "") + &route("gone", &[S1], "")));
    let new = config(
        &("max_body = \"2MiB\"\n[dedup]\nin_flight = \"wait\"\n".to_string()
            + &route("a", &[S2, S1], "tolerance = \"1m\"")
            + &route("b", &[S1], "")),
    );
    assert!(restart_needed(&old, &new).is_empty());
    let c = changes(&old, &new);
    assert_eq!(c.added, ["b"]);
    assert_eq!(c.removed, ["gone"]);
    assert_eq!(c.edited, ["a"]);
    assert_eq!(
        c.secrets,
        [SecretChange {
            route: "a".into(),
            added: vec![0],
            removed: vec![],
        }]
    );
    assert_eq!(c.other, ["max_body", "dedup.in_flight"]);
    let line = c.to_string();
    assert_eq!(
        line,
        "routes added: b; routes removed: gone; routes edited: a; route a secrets added #0; \
         changed: max_body, dedup.in_flight"
    );
    assert!(!line.contains(S1) && !line.contains(S2), "{line}");
}

#[test]
fn a_rotated_secret_is_logged_by_index_and_an_identical_file_is_no_change() {
    let old = config(&route("a", &[S1, S2], ""));
    let new = config(&route("a", &[S2], ""));
    let c = changes(&old, &new);
    assert!(c.edited.is_empty(), "only the secrets changed: {c:?}");
    assert_eq!(c.to_string(), "route a secrets removed #0");
    let same = changes(&old, &config(&route("a", &[S1, S2], "")));
    assert!(same.is_empty());
    assert_eq!(same.to_string(), "no change");
}

#[test]
fn listeners_and_the_store_need_a_restart_lifetimes_and_admin_tokens_do_not() {
    let old = config(&route("a", &[S1], ""));
    let new = config(
        &("listen = \"127.0.0.1:1\"\nworker_threads = 7\nadmin_token = \"ops=ops-token-abcdefghijklmnop\"\n\
           [store]\nurl = \"redis://127.0.0.1:1\"\n[dedup]\nretention = \"2h\"\n"
            .to_string()
            + &route("a", &[S1], "lease = \"9s\"")),
    );
    let fields = restart_needed(&old, &new);
    for f in ["listen", "worker_threads", "store.url"] {
        assert!(fields.iter().any(|x| x == f), "{f} not in {fields:?}");
    }
    // The stores read every route's lease and retention from one swapped handle.
    assert!(
        !fields
            .iter()
            .any(|x| x.contains("lease") || x.contains("retention")),
        "{fields:?}"
    );
    assert!(
        !fields.iter().any(|x| x.contains("admin_token")),
        "{fields:?}"
    );
    let e = crate::reload::ReloadError::RestartNeeded(fields).to_string();
    assert!(
        e.starts_with("a restart is needed to change listen, "),
        "{e}"
    );
    assert!(e.ends_with("nothing of this reload was applied"), "{e}");
}

#[test]
fn an_async_route_may_rotate_secrets_and_change_its_policy_not_its_worker_settings_but_its_bound_and_lease()
 {
    let q = |extra: &str| {
        route(
            "q",
            &[S1],
            &format!("mode = \"async\"\nack_body = \"ok\"\nmax_concurrency = 2\n{extra}"),
        )
    };
    let worker = q("");
    let started = config(&(worker.clone() + &route("s", &[S1], "")));
    let rotated = config(&route(
        "q",
        &[S2],
        "mode = \"async\"\nack_body = \"ok\"\nmax_concurrency = 2",
    ));
    assert!(restart_needed(&started, &rotated).is_empty());
    let policy = config(&route(
        "q",
        &[S1],
        "mode = \"async\"\nack_body = \"other\"\nmax_concurrency = 2\nrate = 5\nbackoff = \"2s\"\nmax_attempts = 3",
    ));
    assert!(restart_needed(&started, &policy).is_empty());
    // Its retention and lease change live (the stores read them per write, the worker
    // the lease per attempt), and its `max_concurrency` (read at each admission).
    assert!(restart_needed(&started, &config(&q("retention = \"2h\""))).is_empty());
    assert!(restart_needed(&started, &config(&q("lease = \"9s\""))).is_empty());
    for bound in ["max_concurrency = 3", ""] {
        let moved = format!("mode = \"async\"\nack_body = \"ok\"\n{bound}");
        let moved = config(&route("q", &[S1], &moved));
        assert!(restart_needed(&started, &moved).is_empty(), "{bound}");
    }
    for held in [q("order_key = \"header:x\""), q("upstream_path = \"/x\"")] {
        assert_eq!(
            restart_needed(&started, &config(&held)),
            ["route q: async route settings"],
            "{held}"
        );
    }
    let made_sync = config(&route("q", &[S1], ""));
    assert_eq!(
        restart_needed(&started, &made_sync),
        ["route q: async route settings"]
    );
    let new_async = config(&(worker + &route("s", &[S1], "mode = \"async\"")));
    assert_eq!(
        restart_needed(&started, &new_async),
        ["route s: async route settings"]
    );
    // Removed: its worker drains what is queued (mod.rs); nothing needs a restart.
    assert!(restart_needed(&started, &config(&route("s", &[S1], ""))).is_empty());
}

#[test]
fn tracing_sampling_changes_live_its_exporter_needs_a_restart() {
    let tracing = |extra: &str| {
        config(&format!(
            "[tracing]\notlp_endpoint = \"http://127.0.0.1:4318\"\n{extra}\n"
        ))
    };
    let old = tracing("");
    let sampling = tracing("start_traces = true\nsample_ratio = 0.25");
    assert!(restart_needed(&old, &sampling).is_empty());
    assert_eq!(
        restart_needed(&old, &tracing("service_name = \"other\"")),
        ["tracing.service_name"]
    );
    assert_eq!(restart_needed(&old, &config("")), ["tracing.otlp_endpoint"]);
}
