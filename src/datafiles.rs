//! pg_idgen's files in the data directory, all in its directory `pg_idgen/`
//! (copied by `pg_basebackup` and `pg_rewind` with the rest): each written
//! whole or not at all, under one named LWLock that every writer takes, by
//! writing it aside and moving it into place with PostgreSQL's
//! `durable_rename()` (which syncs the file, the rename and the directory).

use std::ffi::CString;

use pgrx::lwlock::PgLwLock;
use pgrx::prelude::*;

use crate::errors::IdError;

/// The directory, relative to the data directory (every process's working directory).
pub const DIR: &str = "pg_idgen";

/// Taken by every writer of the files.
// SAFETY: the name is pg_idgen's own.
pub static LOCK: PgLwLock<bool> = unsafe { PgLwLock::new(c"pg_idgen files") };

/// The path of file `name`.
pub fn path(name: &str) -> String {
    format!("{DIR}/{name}")
}

/// The text of file `name`, if it exists and can be read.
pub fn read(name: &str) -> Option<String> {
    std::fs::read_to_string(path(name)).ok()
}

/// The names of the files whose name starts with `prefix`, with what follows it.
pub fn named(prefix: &str) -> Vec<(String, String)> {
    std::fs::read_dir(DIR)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let rest = name.strip_prefix(prefix)?.to_owned();
            Some((name, rest))
        })
        .collect()
}

/// Under the lock, gives `change` what file `name` holds now (None: no
/// file) and writes what it returns (None: leaves the file as it is).
pub fn update(name: &str, change: impl FnOnce(Option<String>) -> Option<String>) {
    let _lock = LOCK.exclusive();
    if let Some(text) = change(read(name)) {
        write(name, &text);
    }
}

/// Writes file `name` under the lock, or says why it could not (for a
/// process that goes on without it: the lease keeper).
pub fn try_write(name: &str, text: &str) -> Result<(), String> {
    let _lock = LOCK.exclusive();
    let (target, aside) = paths(name);
    std::fs::create_dir_all(DIR).map_err(|e| format!("{DIR}: {e}"))?;
    std::fs::write(&aside, text).map_err(|e| format!("{aside}: {e}"))?;
    let (from, to) = (CString::new(aside).expect("no NUL"), CString::new(target.clone()).expect("no NUL"));
    // SAFETY: two paths of ours; at LOG, a failed step is logged and returned.
    match unsafe { pg_sys::durable_rename(from.as_ptr(), to.as_ptr(), pgrx::PgLogLevel::LOG as i32) } {
        0 => Ok(()),
        _ => Err(format!("could not write file \"{target}\" (see the log)")),
    }
}

/// The path of file `name`, and the one it is written aside under by this process.
fn paths(name: &str) -> (String, String) {
    let target = path(name);
    // SAFETY: MyProcPid is set in every process.
    let aside = format!("{target}.tmp{}", unsafe { pg_sys::MyProcPid });
    (target, aside)
}

/// Removes file `name`, under the lock.
pub fn remove(name: &str) {
    let _lock = LOCK.exclusive();
    let _ = std::fs::remove_file(path(name));
}

/// Writes file `name` aside, then moves it into place durably. The caller holds the lock.
fn write(name: &str, text: &str) {
    let (target, aside) = paths(name);
    let failed = |e: std::io::Error| -> ! { IdError::Internal(format!("could not write file \"{aside}\": {e}")).raise() };
    std::fs::create_dir_all(DIR).unwrap_or_else(|e| failed(e));
    std::fs::write(&aside, text).unwrap_or_else(|e| failed(e));
    let (from, to) = (CString::new(aside.clone()).expect("no NUL"), CString::new(target).expect("no NUL"));
    // SAFETY: two paths of ours; durable_rename raises an ERROR itself if
    // any step fails (the lock is released with the transaction or process).
    unsafe { pg_sys::durable_rename(from.as_ptr(), to.as_ptr(), pgrx::PgLogLevel::ERROR as i32) };
}

/// Files of pg_idgen 0.10.0 and before, in the data directory's root, and
/// where they go now.
const MOVED: [(&str, &str); 3] = [("pg_idgen_mark.", "mark."), ("pg_idgen_held.", "held."), ("pg_idgen_citus.", "citus.")];

/// In the postmaster, while preloading (before the files are read): moves
/// the files of pg_idgen 0.10.0 and before from the data directory's root
/// into `pg_idgen/`, and removes their lock files and what a crash left
/// written aside. A value file met in both places keeps the larger value
/// (the marks); a hand-over file, the newer. A file that cannot be moved
/// stops the server from starting: without it an ID could repeat.
pub fn move_old_files() {
    let entries: Vec<String> = std::fs::read_dir(".")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pg_idgen_"))
        .collect();
    let failed = |what: &str, e: std::io::Error| -> ! {
        IdError::Internal(format!("could not move \"{what}\" into the data directory's {DIR}/: {e}")).raise()
    };
    for name in entries {
        if name.contains(".tmp") || name.ends_with(".lock") {
            let _ = std::fs::remove_file(&name);
            continue;
        }
        let Some((old, new)) = MOVED.iter().find_map(|(old, new)| name.strip_prefix(old).map(|rest| (old, format!("{new}{rest}")))) else {
            continue;
        };
        std::fs::create_dir_all(DIR).unwrap_or_else(|e| failed(&name, e));
        let target = path(&new);
        let keep_old = match std::fs::metadata(&target) {
            Err(_) => true,
            Ok(meta) if *old == "pg_idgen_citus." => std::fs::metadata(&name).and_then(|m| m.modified()).ok() >= meta.modified().ok(),
            Ok(_) => {
                let value = |p: &str| std::fs::read_to_string(p).ok().and_then(|t| t.trim().parse::<i64>().ok()).unwrap_or(0);
                value(&name) > value(&target)
            }
        };
        if keep_old {
            std::fs::rename(&name, &target).unwrap_or_else(|e| failed(&name, e));
        } else {
            std::fs::remove_file(&name).unwrap_or_else(|e| failed(&name, e));
        }
    }
    // What a crash left written aside in the directory itself.
    for (name, _) in named("") {
        if name.contains(".tmp") {
            let _ = std::fs::remove_file(path(&name));
        }
    }
    // The renames reach the disk before anything is read or written anew.
    if std::path::Path::new(DIR).exists() {
        for dir in [DIR, "."] {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).unwrap_or_else(|e| failed(dir, e));
        }
    }
}
