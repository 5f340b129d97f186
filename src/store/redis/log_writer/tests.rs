use super::*;

const TTLS: WriteTtls = WriteTtls {
    hash: 1000,
    fragment: 900,
    index: 1100,
};
/// Route `b`'s: a longer retention than the others'.
const TTLS_B: WriteTtls = WriteTtls {
    hash: 2000,
    fragment: 1900,
    index: 2200,
};

fn write(route: &str, key: &str, now: u64, claimed: bool) -> LogWrite {
    LogWrite {
        route: route.into(),
        key: key.to_string(),
        now,
        ttls: if route == "b" { TTLS_B } else { TTLS },
        kind: if claimed {
            WriteKind::Claimed(None)
        } else {
            WriteKind::Copy
        },
    }
}

/// Each command as its words, for comparing.
fn words(pipe: &Pipeline) -> Vec<String> {
    pipe.cmd_iter()
        .map(|c| {
            c.args_iter()
                .map(|a| match a {
                    redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                    _ => "<other>".into(),
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect()
}

fn names() -> Names {
    Names { prefix: "p".into() }
}

/// A batch: the claims' members in one `ZADD` per route, copies summed per delivery
/// into one transaction; a claim writes no log hash.
#[test]
fn a_batch_sums_copies_per_delivery_and_members_per_route() {
    let mut sums = Sums::default();
    for w in [
        write("a", "k1", 10, true),
        write("b", "k2", 11, false),
        write("a", "k3", 12, true),
        write("b", "k4", 13, true),
        write("b", "k2", 14, false),
        write("b", "k2", 12, false),
    ] {
        sums.add(w);
    }
    let plan = sums.plan(&names(), RECENT_PER_ROUTE, true);
    assert_eq!(plan.groups.len(), 1);
    let w = words(&plan.groups[0]);
    assert_eq!(
        w,
        [
            "MULTI",
            "HINCRBY p:{b:k2} duplicates 3",
            "HSET p:{b:k2} last_seen 14",
            "PEXPIRE p:{b:k2} 1900 NX",
            "EXEC",
            "ZMSCORE p:recent:{a} k1 k3",
            "ZADD p:recent:{a} NX 10 k1 12 k3",
            "ZREMRANGEBYRANK p:recent:{a} 0 -10001",
            "PEXPIRE p:recent:{a} 1100",
            // Each index lives as long as its own route's lifetimes say.
            "ZMSCORE p:recent:{b} k4",
            "ZADD p:recent:{b} NX 13 k4",
            "ZREMRANGEBYRANK p:recent:{b} 0 -10001",
            "PEXPIRE p:recent:{b} 2200",
        ]
    );
    // Per slot: one hash, two indexes.
    assert_eq!(sums.plan(&names(), RECENT_PER_ROUTE, false).groups.len(), 3);
}

/// Claims only: no transaction, no log hash.
#[test]
fn a_batch_of_claims_only_has_no_transaction() {
    let mut sums = Sums::default();
    sums.add(write("a", "k1", 10, true));
    sums.add(write("a", "k1", 11, true)); // a key's first claim in the batch stands
    let w = words(&sums.plan(&names(), 5, true).groups[0]);
    assert_eq!(
        w,
        [
            "ZMSCORE p:recent:{a} k1",
            "ZADD p:recent:{a} NX 10 k1",
            "ZREMRANGEBYRANK p:recent:{a} 0 -6",
            "PEXPIRE p:recent:{a} 1100",
        ]
    );
}
