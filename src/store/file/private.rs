//! The store's directory is the owner's alone: it holds stored answers and kept
//! requests (signatures, card numbers). Created 0700, its files 0600 whatever the
//! umask (the process's umask is 077 once a `file:` store opens: the engine creates
//! its own files); modes an earlier version left open are tightened at start; a
//! directory others may write in is refused (they could plant a file or a link); the
//! lock file and the write probe follow no symlink.

use std::fs::{File, OpenOptions};
use std::path::Path;

/// Permission bits of group and others.
const SHARED: u32 = 0o077;
/// Write bits of group and others.
const SHARED_WRITE: u32 = 0o022;

/// Creates `dir` (0700) if missing and refuses it when group or others may write in it.
pub(super) fn prepare(dir: &Path) -> Result<(), String> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder
        .create(dir)
        .map_err(|e| format!("cannot create it: {e}"))?;
    let meta = std::fs::metadata(dir).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_dir() {
        return Err("it is not a directory".into());
    }
    let mode = mode_of(&meta);
    if mode & SHARED_WRITE != 0 {
        return Err(format!(
            "it is writable by group or others (mode {:o}): another local user could plant a file or a link in it; give it to the sidecar's user alone (chmod 700), or name a directory inside it (the sidecar creates it 0700)",
            mode & 0o7777
        ));
    }
    Ok(())
}

/// Makes the files the engine creates from now on the owner's alone (umask 077, for
/// the whole process: the sidecar writes no file meant for others), and takes group
/// and other bits off everything already in `dir`. Returns how many modes it changed.
pub(super) fn seal(dir: &Path) -> Result<usize, String> {
    #[cfg(unix)]
    // SAFETY: umask only swaps the process's file mode mask.
    unsafe {
        libc::umask(0o077);
    }
    tighten(dir).map_err(|e| format!("cannot make it private: {e}"))
}

fn tighten(path: &Path) -> std::io::Result<usize> {
    let meta = std::fs::symlink_metadata(path)?;
    // A link is left alone (its target is not the store's).
    if meta.file_type().is_symlink() {
        return Ok(0);
    }
    let mut changed = 0;
    let mode = mode_of(&meta);
    if mode & SHARED != 0 {
        set_mode(path, mode & !SHARED)?;
        changed += 1;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            changed += tighten(&entry?.path())?;
        }
    }
    Ok(changed)
}

/// Opens (creating it, 0600) a file the store keeps, never through a symlink.
pub(super) fn open_own(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.create(true).truncate(false).read(true).write(true);
    no_follow(&mut options);
    options.open(path)
}

/// Proves `dir` writable with a file of a fresh name, created (never opened through
/// a link: `create_new`), written and removed.
pub(super) fn probe_write(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(format!(
        ".idemgate-write-check-{:016x}",
        rand::random::<u64>()
    ));
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    no_follow(&mut options);
    let written = options
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"ok"));
    let removed = std::fs::remove_file(&path);
    written.and(removed)
}

#[cfg(unix)]
fn no_follow(options: &mut OpenOptions) {
    use std::os::unix::fs::OpenOptionsExt;
    options.mode(0o600).custom_flags(libc::O_NOFOLLOW);
}

#[cfg(not(unix))]
fn no_follow(_: &mut OpenOptions) {}

#[cfg(unix)]
fn mode_of(meta: &std::fs::Metadata) -> u32 {
    std::os::unix::fs::PermissionsExt::mode(&meta.permissions())
}

#[cfg(not(unix))]
fn mode_of(_: &std::fs::Metadata) -> u32 {
    0o700
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

#[cfg(not(unix))]
fn set_mode(_: &Path, _: u32) -> std::io::Result<()> {
    Ok(())
}
