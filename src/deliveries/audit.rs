//! The operator audit log: one line per operator action (target `idemgate::audit`),
//! written alike by the console, the admin API and `idemgate deliveries …`.

/// Logs an admin action: who did what to which delivery, and how it went.
pub(crate) fn audit(who: &str, action: &str, route: &str, key: &str, result: &str) {
    tracing::info!(
        target: "idemgate::audit",
        who,
        action,
        route,
        key,
        result,
        "admin action"
    );
}
