//! What starts a reload besides the admin API: SIGHUP, and a change in the directory of
//! the configuration file or of any `file:` secret. A Kubernetes volume (Secret,
//! ConfigMap) is updated by writing a new timestamped directory and swapping the
//! `..data` symlink, so the directories are watched (inotify, through `notify`), not
//! the files' inodes. Changes are debounced (a swap is several events) and reloads
//! spaced, so a burst of writes is one reload.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::Notify;

use super::Reloader;

/// A change is reloaded once nothing more has changed for this long.
const QUIET: Duration = Duration::from_millis(200);
/// ... or at the latest this long after the first change of a burst.
const MAX_WAIT: Duration = Duration::from_secs(2);
/// Watched changes start at most one reload per this period.
const MIN_INTERVAL: Duration = Duration::from_millis(500);

/// The reload triggers of one process; dropping it stops them.
pub struct Triggers(tokio::task::JoinHandle<()>);

impl Drop for Triggers {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts SIGHUP handling (registered before this returns: a SIGHUP that arrives once
/// the sidecar is serving never ends it) and the watcher of the configuration's
/// directories. Must be called within the runtime.
pub fn spawn_triggers(reloader: Arc<Reloader>) -> Triggers {
    use tokio::signal::unix::{SignalKind, signal};
    let hup = signal(SignalKind::hangup())
        .inspect_err(|e| tracing::warn!(error = %e, "SIGHUP cannot be handled: reload through the admin API"))
        .ok();
    let changed = Arc::new(Notify::new());
    let files = Arc::new(Mutex::new(HashSet::new()));
    let watcher = {
        let (changed, files) = (changed.clone(), files.clone());
        notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
            if let Ok(ev) = ev
                && relevant(&ev, &files.lock().unwrap_or_else(|e| e.into_inner()))
            {
                changed.notify_one();
            }
        })
        .inspect_err(|e| tracing::warn!(error = %e, "cannot watch the configuration's files: reload with SIGHUP or the admin API"))
        .ok()
    };
    let mut watched = Watched {
        watcher,
        dirs: HashSet::new(),
        files,
    };
    watched.follow(reloader.live().load().config());
    Triggers(tokio::spawn(async move {
        let mut hup = hup;
        loop {
            let trigger = tokio::select! {
                Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => "SIGHUP",
                _ = changed.notified() => {
                    settle(&changed).await;
                    "file change"
                }
            };
            let _ = reloader.reload(trigger).await;
            watched.follow(reloader.live().load().config());
            if trigger == "file change" {
                tokio::time::sleep(MIN_INTERVAL).await;
            }
        }
    }))
}

/// Waits until the changes stop for `QUIET` (at most `MAX_WAIT`).
async fn settle(changed: &Notify) {
    let deadline = tokio::time::Instant::now() + MAX_WAIT;
    loop {
        tokio::select! {
            _ = changed.notified() => {}
            _ = tokio::time::sleep(QUIET) => return,
            _ = tokio::time::sleep_until(deadline) => return,
        }
    }
}

/// The watched directories and the files in them that matter.
struct Watched {
    watcher: Option<notify::RecommendedWatcher>,
    dirs: HashSet<PathBuf>,
    /// The configuration file and every `file:` secret, absolute.
    files: Arc<Mutex<HashSet<PathBuf>>>,
}

impl Watched {
    /// Watches what `config` reads (the directories of secrets a reload added too).
    fn follow(&mut self, config: &crate::config::Config) {
        let Some(watcher) = self.watcher.as_mut() else {
            return;
        };
        let mut files = config.watched_files();
        for f in &mut files {
            *f = absolute(f);
        }
        for f in &files {
            let Some(dir) = f.parent() else { continue };
            if self.dirs.insert(dir.to_path_buf()) {
                match watcher.watch(dir, RecursiveMode::NonRecursive) {
                    Ok(()) => {
                        tracing::debug!(dir = %dir.display(), "watching for configuration changes")
                    }
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "cannot watch: changes there need SIGHUP or POST /admin/reload")
                    }
                }
            }
        }
        *self.files.lock().unwrap_or_else(|e| e.into_inner()) = files.into_iter().collect();
    }
}

fn absolute(p: &Path) -> PathBuf {
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// Whether `ev` may change the configuration: a write, create, rename or removal of a
/// watched file, or of a `..`-named entry (the kubelet's `..data` symlink and its
/// timestamped directories). Reads (the reload's own) and other files are not.
fn relevant(ev: &notify::Event, files: &HashSet<PathBuf>) -> bool {
    let writes = match ev.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    };
    writes
        && ev.paths.iter().any(|p| {
            files.contains(p)
                || p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(".."))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: EventKind, path: &str) -> notify::Event {
        notify::Event::new(kind).add_path(PathBuf::from(path))
    }

    #[test]
    fn a_kubelet_swap_and_a_watched_file_count_but_reads_and_other_files_do_not() {
        use notify::event::{CreateKind, ModifyKind, RenameMode};
        let files: HashSet<PathBuf> =
            [PathBuf::from("/s/key"), PathBuf::from("/c/idemgate.toml")].into();
        let rename = EventKind::Modify(ModifyKind::Name(RenameMode::To));
        assert!(relevant(&event(rename, "/s/..data"), &files));
        assert!(relevant(
            &event(EventKind::Create(CreateKind::Folder), "/s/..2026_12_07"),
            &files
        ));
        assert!(relevant(
            &event(EventKind::Modify(ModifyKind::Any), "/c/idemgate.toml"),
            &files
        ));
        assert!(relevant(
            &event(
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                "/s/key"
            ),
            &files
        ));
        assert!(!relevant(
            &event(
                EventKind::Access(AccessKind::Open(AccessMode::Any)),
                "/s/key"
            ),
            &files
        ));
        assert!(!relevant(
            &event(
                EventKind::Access(AccessKind::Close(AccessMode::Read)),
                "/s/key"
            ),
            &files
        ));
        assert!(!relevant(
            &event(EventKind::Modify(ModifyKind::Any), "/c/stderr.log"),
            &files
        ));
    }
}
