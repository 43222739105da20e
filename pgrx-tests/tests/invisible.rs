//! Preloading pg_idgen changes nothing for queries that do not use it.
//!
//! A differential test: the same SQL corpus runs with psql on two stock
//! servers (no pg_idgen loaded) and on one with `shared_preload_libraries =
//! 'pg_idgen'`, and the outputs, normalized only where two servers may
//! legitimately differ, must match file by file. The two stock runs find
//! what stock PostgreSQL itself does not reproduce (those lines are left
//! out of the comparison and counted). Three phases, each in a database of
//! its own on every server:
//!
//! - `regress`: PostgreSQL 15's own regression SQL (fetched by
//!   `scripts/corpus`), every file of `parallel_schedule` in order, one
//!   after the other, in database `regression`. Every server has the
//!   extension in database `postgres` but not in `regression`: this tests
//!   the preload alone (shared memory, the planner hook deciding the
//!   database has no pg_idgen).
//! - `regress_ext`: the same files again in database `regression_ext`,
//!   where every server runs `CREATE EXTENSION pg_idgen` first (a stock
//!   server installs it without the preload, as the README and docs/operating.md say). The
//!   catalog-wide queries of the regression tests (every function, every
//!   event trigger, `\df`, the sanity checks over all of pg_proc) then list
//!   the same objects everywhere, and the only difference left is the
//!   preloaded library, whose planner hook walks every query of the suite.
//! - `own`: the hand-written corpus in `pgrx-tests/corpus/`, aimed at what a
//!   planner hook can break (planning-time errors with their CONTEXT,
//!   position and internal query, error fields read back with GET STACKED
//!   DIAGNOSTICS, plans, nested planning, very deep expressions), in
//!   database `own`; the preloaded server has the extension created there,
//!   the stock servers do not (the corpus lists no catalog-wide objects).
//!
//! Beside it: error reports carry no Rust backtrace (with `RUST_BACKTRACE=1`
//! in the server's environment) and equal stock's field by field; 100,000
//! planning-time errors caught in one backend leak no more than on stock;
//! very deep expressions give stock's result or SQLSTATE, without a crash.
//!
//! Run: `cargo pgrx install --release --pg-config $PG_CONFIG`, then
//! `PG_CONFIG=... cargo test -p pg_idgen_e2e --test invisible -- --nocapture`.
//! `scripts/corpus` is run by the test (idempotent; it needs root and the
//! network the first time); `PG_IDGEN_CORPUS` moves its cache.
//! `PG_IDGEN_INVISIBLE_CONTROL=1` makes the third server of the corpus test
//! a stock one too (no preload, the extension created where the preloaded
//! server has it): a check of the test itself, which must then pass.
//! The normalized outputs of a failed corpus run stay in
//! `$TMPDIR/pg_idgen_invisible-<pid>/` (`diff -r stock-a preloaded`).

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pg_idgen_e2e::postgres::error::{DbError, ErrorPosition};
use pg_idgen_e2e::postgres::Error as PgError;
use pg_idgen_e2e::postgres::{Client, NoTls, SimpleQueryMessage};
use pg_idgen_e2e::{bindir, pg_config, Server, PORT};

const PRELOAD: &str = "shared_preload_libraries = 'pg_idgen'";
/// See where the servers start.
const NO_AUTOVACUUM: &str = "autovacuum = off";
/// Every statement of the corpus stops after this long.
const STATEMENT_TIMEOUT: &str = "60s";
/// One psql run (one corpus file) is killed after this long.
const FILE_LIMIT: Duration = Duration::from_secs(300);
/// All phases of one server together stop starting new files after this long.
const RUN_LIMIT: Duration = Duration::from_secs(1200);
/// Lines of differences printed at most, in all.
const PRINT_LIMIT: usize = 400;

// ---------------------------------------------------------------------------
// The differential corpus test

/// PostgreSQL's own regression SQL (15's, as `scripts/corpus` fetches it):
/// on another major version its expected behaviour differs, so scripts/test
/// names this test as skipped there.
#[test]
fn regression_sql_outputs_are_unchanged_by_the_preload() {
    let version = pg_config("--version").to_string_lossy().into_owned();
    assert!(
        version.starts_with("PostgreSQL 15"),
        "{version}: the regression SQL of scripts/corpus is PostgreSQL 15's (scripts/test skips this test elsewhere, saying so)"
    );
    let regress = RegressCorpus::fetch();
    // Without it, the regression tests that load its functions would fail
    // alike on every server and test nothing.
    assert!(
        regress.libdir.join("regress.so").exists(),
        "scripts/corpus built no regress.so in {}: it builds it against $PG_CONFIG's server headers",
        regress.dir.join("lib").display()
    );
    differential("regress", regress, &[]);
}

/// The own corpus (pgrx-tests/corpus/, written for every version).
#[test]
fn own_corpus_outputs_are_unchanged_by_the_preload() {
    // Its files run in the same psql environment (PG_LIBDIR, the data files).
    let mut regress = RegressCorpus::fetch();
    regress.tests.clear();
    differential("own", regress, &own_corpus());
}

/// Runs `regress`'s tests and the `own` files on two stock servers and a
/// preloaded one, and compares their outputs.
fn differential(name: &str, regress: RegressCorpus, own: &[PathBuf]) {
    let started = Instant::now();
    let files = corpus_files(&regress, own);
    let statements: usize = files.iter().map(|f| f.statements).sum();
    println!(
        "corpus: {} ({}), {} regression files x 2 phases, {} own files: {} files, about {} statements",
        regress.dir.display(),
        regress.version,
        regress.tests.len(),
        own.len(),
        files.len(),
        statements
    );

    // RUST_BACKTRACE=1 for every server, so that the outcome does not depend on
    // the caller's environment: the strictest setting (a correct library shows
    // no backtrace either way; a stock server ignores it).
    let env = [("RUST_BACKTRACE", "1")];
    // PG_IDGEN_INVISIBLE_CONTROL=1: the third server is not preloaded (and
    // has the extension created in the same databases): a check of the test
    // itself, which must then find no difference.
    let control = std::env::var_os("PG_IDGEN_INVISIBLE_CONTROL").is_some_and(|v| !v.is_empty() && v != "0");
    let third_label = if control { "control" } else { "preloaded" };
    if control {
        println!("PG_IDGEN_INVISIBLE_CONTROL is set: the third server is a stock one (no preload), as a check of the test");
    }
    let (stock_a, stock_b, preloaded) = std::thread::scope(|s| {
        // No autovacuum on any of the three: its workers take backend slots
        // at moments of their own, and a session in a slot not used before
        // makes a temporary schema pair (two OIDs), which shifts the OIDs
        // opr_sanity lists on one server and not on another.
        let a = s.spawn(|| Server::init_env(&format!("diff-{name}-stock-a"), &[NO_AUTOVACUUM], &env));
        let b = s.spawn(|| Server::init_env(&format!("diff-{name}-stock-b"), &[NO_AUTOVACUUM], &env));
        let p = s.spawn(|| {
            Server::init_env(&format!("diff-{name}-{third_label}"), if control { &[NO_AUTOVACUUM] } else { &[NO_AUTOVACUUM, PRELOAD] }, &env)
        });
        (a.join().unwrap(), b.join().unwrap(), p.join().unwrap())
    });
    // Every server has the extension in `postgres` too, so that all three
    // hand out the same OIDs to what the corpus creates (opr_sanity lists
    // some by OID).
    for server in [&stock_a, &stock_b, &preloaded] {
        server.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    }
    // The preload's loader exits after loading and is started again 10 s
    // later to idle, in a backend slot of its own: the corpus begins once it
    // idles, so that slot is taken throughout (see NO_AUTOVACUUM's comment).
    if !control {
        let mut c = preloaded.client();
        pg_idgen_e2e::eventually(60, "the pg_idgen loader idles", || {
            c.query_one("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'pg_idgen loader' AND datid IS NULL", &[])
                .unwrap()
                .get::<_, i64>(0)
                == 1
        });
    }

    // The outputs stay for inspection when the test fails (removed when it passes).
    let out_root = std::env::temp_dir().join(format!("pg_idgen_invisible-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_root);
    let runs: Vec<RunResult> = std::thread::scope(|s| {
        let handles: Vec<_> = [
            ("stock-a", &stock_a, false),
            ("stock-b", &stock_b, false),
            (third_label, &preloaded, true),
        ]
        .into_iter()
        .map(|(label, server, preload)| {
            let files = &files;
            let out = out_root.join(label);
            let regress = &regress;
            s.spawn(move || run_corpus(label, server, preload, regress, files, &out))
        })
        .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a corpus run panicked"))
            .collect()
    });
    let (a, b, p) = (&runs[0], &runs[1], &runs[2]);
    for r in &runs {
        println!(
            "run {}: {} files in {:.0} s{}{}{}",
            r.label,
            r.outputs.len(),
            r.elapsed.as_secs_f64(),
            if r.crashes.is_empty() {
                String::new()
            } else {
                format!(", {} backend crashes", r.crashes.len())
            },
            if r.killed.is_empty() {
                String::new()
            } else {
                format!(", killed after {FILE_LIMIT:?}: {:?}", r.killed)
            },
            if r.not_run.is_empty() {
                String::new()
            } else {
                format!(", {} files not run (time out, setup failed or server down)", r.not_run.len())
            },
        );
    }

    let mut report = Report::default();
    for f in &files {
        let (Some(la), Some(lb), Some(lp)) = (a.outputs.get(&f.key), b.outputs.get(&f.key), p.outputs.get(&f.key)) else {
            report.missing.push(f.key.clone());
            continue;
        };
        compare_file(&f.key, la, lb, lp, &mut report);
    }
    for r in [a, b] {
        for (file, line) in &r.crashes {
            report
                .problems
                .push(format!("stock server {} crashed in {file}: {line}", r.label));
        }
    }
    for (file, line) in &p.crashes {
        report
            .problems
            .push(format!("the {third_label} server crashed in {file}: {line}"));
    }
    for r in &runs {
        report.problems.extend(r.setup_errors.iter().cloned());
        for k in &r.killed {
            report
                .problems
                .push(format!("{}: psql on {k} did not finish within {FILE_LIMIT:?}", r.label));
        }
    }

    println!(
        "summary: {} files, about {} statements; {} files differ between stock and stock ({} lines excluded as \
         nondeterministic); {} files differ unexplained between stock and {third_label} ({} hunks, {} lines: {}); {} missing; {:.0} s",
        files.len(),
        statements,
        report.noisy_files.len(),
        report.excluded_lines,
        report.differing_files.len(),
        report.hunks.len(),
        report.hunks.iter().map(|h| h.lines).sum::<usize>(),
        report.kinds(),
        report.missing.len(),
        started.elapsed().as_secs_f64()
    );
    if !report.noisy_files.is_empty() {
        println!("nondeterministic on stock (lines left out of the comparison):");
        for (k, n) in &report.noisy_files {
            println!("  {k}: {n} lines");
        }
    }
    println!("normalized outputs: {} (diff -r stock-a {third_label})", out_root.display());
    if !report.differing_files.is_empty() {
        println!("files that differ: {}", report.differing_files.join(" "));
        report.print_hunks();
    }
    for m in &report.problems {
        println!("problem: {m}");
    }
    let passed = report.differing_files.is_empty() && report.missing.is_empty() && report.problems.is_empty();
    if passed {
        let _ = std::fs::remove_dir_all(&out_root);
    }
    assert!(
        passed,
        "preloading pg_idgen changed the output of {} corpus files ({} unexplained hunks), {} files missing, {} problems: {:?}; \
         see the hunks printed above and {}",
        report.differing_files.len(),
        report.hunks.len(),
        report.missing.len(),
        report.problems.len(),
        report.problems.iter().take(10).collect::<Vec<_>>(),
        out_root.display()
    );
}

/// PostgreSQL's regression SQL, as `scripts/corpus` leaves it.
struct RegressCorpus {
    dir: PathBuf,
    version: String,
    /// `parallel_schedule` flattened: every test, in schedule order.
    tests: Vec<String>,
    /// Where `PG_LIBDIR` points: regress.so, when scripts/corpus could build it.
    libdir: PathBuf,
}

impl RegressCorpus {
    fn fetch() -> RegressCorpus {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/corpus");
        let out = Command::new("bash")
            .arg(&script)
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("{}: {e}", script.display()));
        assert!(
            out.status.success(),
            "scripts/corpus failed ({}): it fetches PostgreSQL's regression SQL once, as root, from deb.debian.org",
            out.status
        );
        let dir = PathBuf::from(
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .lines()
                .last()
                .unwrap_or("")
                .trim(),
        );
        let schedule = std::fs::read_to_string(dir.join("parallel_schedule")).expect("parallel_schedule");
        let mut tests = Vec::new();
        for line in schedule.lines() {
            if let Some(names) = line.strip_prefix("test:") {
                for name in names.split_whitespace() {
                    if !tests.iter().any(|t| t == name) {
                        tests.push(name.to_string());
                    }
                }
            }
        }
        for t in &tests {
            assert!(
                dir.join("sql").join(format!("{t}.sql")).exists(),
                "{t}.sql missing in {}",
                dir.display()
            );
        }
        let version = std::fs::read_to_string(dir.join("VERSION"))
            .unwrap_or_default()
            .trim()
            .to_string();
        // Where regress.so could not be built (its source is 15's), the
        // installation's own library directory: the own corpus loads none of it.
        let libdir = if dir.join("lib/regress.so").exists() { dir.join("lib") } else { pg_config("--pkglibdir") };
        RegressCorpus {
            dir,
            version,
            tests,
            libdir,
        }
    }
}

fn own_corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "sql"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no SQL in {}", dir.display());
    files
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    Regress,
    RegressExt,
    Own,
}

impl Phase {
    fn db(self) -> &'static str {
        match self {
            Phase::Regress => "regression",
            Phase::RegressExt => "regression_ext",
            Phase::Own => "own",
        }
    }
    fn name(self) -> &'static str {
        match self {
            Phase::Regress => "regress",
            Phase::RegressExt => "regress_ext",
            Phase::Own => "own",
        }
    }
}

struct CorpusFile {
    /// `phase/name`, such as `regress/join`.
    key: String,
    name: String,
    path: PathBuf,
    phase: Phase,
    /// A rough count: lines ending a statement or running \gexec.
    statements: usize,
}

fn corpus_files(regress: &RegressCorpus, own: &[PathBuf]) -> Vec<CorpusFile> {
    let mut files = Vec::new();
    for phase in [Phase::Regress, Phase::RegressExt] {
        for t in &regress.tests {
            let path = regress.dir.join("sql").join(format!("{t}.sql"));
            files.push(CorpusFile {
                key: format!("{}/{t}", phase.name()),
                name: t.clone(),
                statements: count_statements(&path),
                path,
                phase,
            });
        }
    }
    for path in own {
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        files.push(CorpusFile {
            key: format!("own/{name}"),
            name,
            statements: count_statements(path),
            path: path.clone(),
            phase: Phase::Own,
        });
    }
    files
}

fn count_statements(path: &Path) -> usize {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("--") && (l.ends_with(';') || l.ends_with("\\gexec")))
        .count()
}

struct RunResult {
    label: &'static str,
    /// Normalized output lines of each file that ran, by key.
    outputs: BTreeMap<String, Vec<String>>,
    /// (file, log line) for each backend crash seen in the server log.
    crashes: Vec<(String, String)>,
    killed: Vec<String>,
    not_run: Vec<String>,
    setup_errors: Vec<String>,
    elapsed: Duration,
}

/// Runs every corpus file on one server, phase by phase; `extension_in_own`:
/// CREATE EXTENSION in the own corpus' database.
fn run_corpus(
    label: &'static str,
    server: &Server,
    extension_in_own: bool,
    regress: &RegressCorpus,
    files: &[CorpusFile],
    out_dir: &Path,
) -> RunResult {
    let started = Instant::now();
    let build = server.dir.join("build");
    std::fs::create_dir_all(build.join("results")).unwrap();
    give_to_postgres(&build);
    let mut result = RunResult {
        label,
        outputs: BTreeMap::new(),
        crashes: Vec::new(),
        killed: Vec::new(),
        not_run: Vec::new(),
        setup_errors: Vec::new(),
        elapsed: Duration::ZERO,
    };
    let server_dir = server.dir.to_string_lossy().into_owned();
    let mut log_offset = 0u64;
    let mut phase = None;
    let mut phase_ready = false;
    // Unreachable for a minute once: the server is down for good, the
    // remaining files are not run (and reported missing).
    let mut down = false;
    for f in files {
        if down {
            result.not_run.push(f.key.clone());
            continue;
        }
        if phase != Some(f.phase) {
            phase = Some(f.phase);
            let with_extension = match f.phase {
                Phase::Regress => false,
                Phase::RegressExt => true,
                Phase::Own => extension_in_own,
            };
            down = !wait_ready(server, Duration::from_secs(60));
            phase_ready = !down && {
                match create_database(server, f.phase.db(), with_extension) {
                    Ok(()) => true,
                    Err(e) => {
                        result
                            .setup_errors
                            .push(format!("{label}: setting up database {}: {e}", f.phase.db()));
                        false
                    }
                }
            };
        }
        if !phase_ready || started.elapsed() > RUN_LIMIT {
            result.not_run.push(f.key.clone());
            continue;
        }
        if !wait_ready(server, Duration::from_secs(60)) {
            down = true;
            result
                .setup_errors
                .push(format!("{label}: the server stopped accepting connections before {}", f.key));
            result.not_run.push(f.key.clone());
            continue;
        }
        let output = out_dir.join("raw").join(format!("{}.out", f.key));
        std::fs::create_dir_all(output.parent().unwrap()).unwrap();
        let env = psql_env(&regress.dir, &build, &regress.libdir, &f.name);
        let finished = run_psql(server, f.phase.db(), &f.path, &output, &env, FILE_LIMIT);
        if !finished {
            result.killed.push(f.key.clone());
        }
        let text = String::from_utf8_lossy(&std::fs::read(&output).unwrap_or_default()).into_owned();
        let lines = normalize(&text, &server_dir);
        let normalized = out_dir.join(format!("{}.out", f.key));
        std::fs::create_dir_all(normalized.parent().unwrap()).unwrap();
        std::fs::write(&normalized, lines.join("\n") + "\n").unwrap();
        result.outputs.insert(f.key.clone(), lines);
        if text.contains("connection to server was lost") {
            // Give the postmaster (bounded) time to log the crash, so that it
            // is blamed on this file.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !read_log_from(server, log_offset).0.lines().any(is_crash_line) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        let (log, next) = read_log_from(server, log_offset);
        log_offset = next;
        for line in log.lines().filter(|l| is_crash_line(l)) {
            result.crashes.push((f.key.clone(), line.to_string()));
        }
    }
    result.elapsed = started.elapsed();
    result
}

/// A database as pg_regress makes its own (from template0, with its
/// ALTER DATABASE settings), and the extension created in it if asked.
fn create_database(server: &Server, db: &str, with_extension: bool) -> Result<(), PgError> {
    let mut c = Client::connect(&server.conninfo("postgres"), NoTls)?;
    c.batch_execute(&format!("CREATE DATABASE {db} TEMPLATE template0"))?;
    for (k, v) in [
        ("lc_messages", "C"),
        ("lc_monetary", "C"),
        ("lc_numeric", "C"),
        ("lc_time", "C"),
        ("bytea_output", "hex"),
        ("timezone_abbreviations", "Default"),
    ] {
        c.batch_execute(&format!("ALTER DATABASE {db} SET {k} TO '{v}'"))?;
    }
    if with_extension {
        Client::connect(&server.conninfo(db), NoTls)?.batch_execute("CREATE EXTENSION pg_idgen")?;
    }
    Ok(())
}

/// The environment pg_regress gives psql, and what PostgreSQL 15's
/// test_setup.sql reads with \getenv. Nothing else of the caller's.
fn psql_env(srcdir: &Path, builddir: &Path, libdir: &Path, test: &str) -> Vec<(String, String)> {
    let s = |p: &Path| p.to_string_lossy().into_owned();
    vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("HOME".into(), s(builddir)),
        ("LANG".into(), "C".into()),
        ("LC_MESSAGES".into(), "C".into()),
        ("PGTZ".into(), "America/Los_Angeles".into()),
        ("PGDATESTYLE".into(), "Postgres, MDY".into()),
        (
            "PGOPTIONS".into(),
            format!("-c intervalstyle=postgres_verbose -c statement_timeout={STATEMENT_TIMEOUT}"),
        ),
        ("PGAPPNAME".into(), format!("pg_regress/{test}")),
        ("PG_ABS_SRCDIR".into(), s(srcdir)),
        ("PG_ABS_BUILDDIR".into(), s(builddir)),
        ("PG_LIBDIR".into(), s(libdir)),
        ("PG_DLSUFFIX".into(), ".so".into()),
    ]
}

extern "C" {
    fn geteuid() -> u32;
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { geteuid() == 0 }
}

/// The uid and gid of the `postgres` user.
fn postgres_ids() -> (u32, u32) {
    let passwd = std::fs::read_to_string("/etc/passwd").expect("/etc/passwd");
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 3 && f[0] == "postgres").then(|| (f[2].parse().ok(), f[3].parse().ok()))
        })
        .and_then(|(u, g)| Some((u?, g?)))
        .expect("a postgres user in /etc/passwd")
}

fn give_to_postgres(dir: &Path) {
    if is_root() {
        let out = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "chown {}", dir.display());
    }
}

/// Runs psql as the `postgres` user on `input`, output and errors
/// interleaved into `output`, as pg_regress does; kills it after `limit`.
/// True when it finished by itself.
fn run_psql(server: &Server, db: &str, input: &Path, output: &Path, env: &[(String, String)], limit: Duration) -> bool {
    use std::os::unix::process::CommandExt;
    let out = File::create(output).unwrap();
    let mut cmd = Command::new(bindir().join("psql"));
    cmd.args(["-X", "-a", "-q", "-h"])
        .arg(&server.dir)
        .args(["-p", &PORT.to_string(), "-U", "postgres", "-d", db])
        .args(["-v", "VERBOSITY=verbose", "-v", "ON_ERROR_STOP=0"])
        .stdin(File::open(input).unwrap_or_else(|e| panic!("{}: {e}", input.display())))
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    if is_root() {
        let (uid, gid) = postgres_ids();
        cmd.uid(uid).gid(gid);
    }
    let mut child = cmd.spawn().expect("psql");
    let deadline = Instant::now() + limit;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return true,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// Waits (bounded) until the server accepts connections, as after a crash
/// and its recovery.
fn wait_ready(server: &Server, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if Client::connect(&server.conninfo("postgres"), NoTls).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn read_log_from(server: &Server, offset: u64) -> (String, u64) {
    let Ok(mut f) = File::open(server.dir.join("server.log")) else {
        return (String::new(), offset);
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    if len <= offset {
        return (String::new(), len);
    }
    let mut buf = Vec::new();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.take(len - offset).read_to_end(&mut buf).unwrap();
    (String::from_utf8_lossy(&buf).into_owned(), len)
}

/// A server log line that says a backend died abnormally (and the
/// postmaster reset every session, the crash recovery).
fn is_crash_line(line: &str) -> bool {
    line.contains("terminated by signal")
        || line.contains("was terminated by exception")
        || line.contains("terminating any other active server processes")
        || (line.contains("server process (PID") && line.contains("exited with exit code"))
}

// ---------------------------------------------------------------------------
// Normalization and comparison

/// Only what legitimately differs between two servers running the same SQL:
/// the server's directory (socket path, data directory), process IDs,
/// timings, temporary schema numbers and temporary relation OIDs, and how
/// many times a recursion repeated a CONTEXT line before reaching
/// max_stack_depth (every stack frame a hook adds lowers that count).
fn normalize(text: &str, server_dir: &str) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut run_line: Option<String> = None;
    let mut run_len = 0usize;
    for raw in text.lines() {
        let mut line = raw.replace(server_dir, "<SERVERDIR>");
        for prefix in ["PID ", "pid ", "process ", "Process ", "backend "] {
            line = replace_number_after(&line, prefix, "<PID>");
        }
        for prefix in ["Planning Time: ", "Execution Time: ", "Time: ", "actual time="] {
            line = replace_number_after(&line, prefix, "<TIME>");
        }
        // Temporary schemas are numbered by backend slot, and temporary
        // relations named by OID: both vary between any two runs.
        for prefix in ["pg_temp_", "pg_toast_temp_"] {
            line = replace_number_after(&line, prefix, "N");
        }
        // Runs of one repeated CONTEXT line (a recursion down to the stack limit).
        let repeatable =
            line.starts_with("SQL function \"") || line.starts_with("PL/pgSQL function ") || line.starts_with("SQL statement \"");
        if repeatable && run_line.as_deref() == Some(line.as_str()) {
            run_len += 1;
            if run_len == REPEAT_COLLAPSE {
                // Drop the run's copies kept so far beyond the first, mark it.
                lines.truncate(lines.len() - (REPEAT_COLLAPSE - 2));
                lines.push("<the line above repeats>".into());
            }
            if run_len >= REPEAT_COLLAPSE {
                continue;
            }
        } else {
            run_line = repeatable.then(|| line.clone());
            run_len = 1;
        }
        lines.push(line);
    }
    lines
}

/// Consecutive copies of one CONTEXT line from which on their count no longer shows.
const REPEAT_COLLAPSE: usize = 20;

/// `prefix` followed by a number (digits, with a decimal fraction): the number replaced.
fn replace_number_after(line: &str, prefix: &str, with: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(i) = rest.find(prefix) {
        let after = &rest[i + prefix.len()..];
        let digits = |s: &str| s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let mut n = digits(after);
        if n > 0 && after[n..].starts_with('.') && digits(&after[n + 1..]) > 0 {
            n += 1 + digits(&after[n + 1..]);
            // A range, as in "actual time=0.010..0.012".
            if after[n..].starts_with("..") && digits(&after[n + 2..]) > 0 {
                n += 2 + digits(&after[n + 2..]);
                if after[n..].starts_with('.') && digits(&after[n + 1..]) > 0 {
                    n += 1 + digits(&after[n + 1..]);
                }
            }
        }
        out.push_str(&rest[..i + prefix.len()]);
        if n > 0 {
            out.push_str(with);
        }
        rest = &after[n..];
    }
    out.push_str(rest);
    out
}

/// A differing region: lines `a.0..a.1` of one side against `b.0..b.1` of the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Region {
    a: (usize, usize),
    b: (usize, usize),
}

/// The differing regions of two line sequences (Myers' O(ND) diff on what
/// remains between the common prefix and suffix; beyond `MAX_D` edits the
/// whole remainder is one region).
fn diff_regions(a: &[String], b: &[String]) -> Vec<Region> {
    const MAX_D: usize = 3000;
    let mut pre = 0;
    while pre < a.len() && pre < b.len() && a[pre] == b[pre] {
        pre += 1;
    }
    let mut suf = 0;
    while suf < a.len() - pre && suf < b.len() - pre && a[a.len() - 1 - suf] == b[b.len() - 1 - suf] {
        suf += 1;
    }
    let (a_mid, b_mid) = (&a[pre..a.len() - suf], &b[pre..b.len() - suf]);
    if a_mid.is_empty() && b_mid.is_empty() {
        return vec![];
    }
    let (n, m) = (a_mid.len() as isize, b_mid.len() as isize);
    let max = (n + m) as usize;
    let off = max as isize + 1;
    let mut v = vec![0isize; 2 * max + 3];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    let mut found = None;
    'outer: for d in 0..=max.min(MAX_D) as isize {
        for k in (-d..=d).step_by(2) {
            let mut x = if k == -d || (k != d && v[(off + k - 1) as usize] < v[(off + k + 1) as usize]) {
                v[(off + k + 1) as usize]
            } else {
                v[(off + k - 1) as usize] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a_mid[x as usize] == b_mid[y as usize] {
                x += 1;
                y += 1;
            }
            v[(off + k) as usize] = x;
            if x >= n && y >= m {
                trace.push((-d..=d).step_by(2).map(|k| v[(off + k) as usize]).collect());
                found = Some(d);
                break 'outer;
            }
        }
        trace.push((-d..=d).step_by(2).map(|k| v[(off + k) as usize]).collect());
    }
    let Some(dmax) = found else {
        return vec![Region {
            a: (pre, a.len() - suf),
            b: (pre, b.len() - suf),
        }];
    };
    // Walk back: which lines of a are deleted and which of b inserted.
    let mut del = vec![false; a_mid.len()];
    let mut ins = vec![false; b_mid.len()];
    let (mut x, mut y) = (n, m);
    let at = |d: isize, k: isize| -> isize { trace[d as usize][((k + d) / 2) as usize] };
    for d in (1..=dmax).rev() {
        let k = x - y;
        let prev_k = if k == -d || (k != d && at(d - 1, k - 1) < at(d - 1, k + 1)) {
            k + 1
        } else {
            k - 1
        };
        let prev_x = at(d - 1, prev_k);
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            x -= 1;
            y -= 1;
        }
        if prev_k == k + 1 {
            ins[prev_y as usize] = true;
        } else {
            del[prev_x as usize] = true;
        }
        x = prev_x;
        y = prev_y;
    }
    // Group into regions: walk both sides in step.
    let mut regions = Vec::new();
    let (mut i, mut j) = (0usize, 0usize);
    while i < a_mid.len() || j < b_mid.len() {
        if i < a_mid.len() && j < b_mid.len() && !del[i] && !ins[j] {
            i += 1;
            j += 1;
            continue;
        }
        let (si, sj) = (i, j);
        while i < a_mid.len() && del[i] {
            i += 1;
        }
        while j < b_mid.len() && ins[j] {
            j += 1;
        }
        if (si, sj) == (i, j) {
            // Only possible at the end of one side.
            i = a_mid.len();
            j = b_mid.len();
        }
        regions.push(Region {
            a: (pre + si, pre + i),
            b: (pre + sj, pre + j),
        });
    }
    regions
}

#[derive(Default)]
struct Report {
    /// (file, lines left out) of files where the two stock runs differ.
    noisy_files: Vec<(String, usize)>,
    excluded_lines: usize,
    differing_files: Vec<String>,
    hunks: Vec<Hunk>,
    missing: Vec<String>,
    problems: Vec<String>,
}

struct Hunk {
    file: String,
    lines: usize,
    text: String,
    /// Rust backtrace lines on the preloaded side.
    backtrace: bool,
    /// Error fields (CONTEXT, QUERY, LINE, SCHEMA NAME...) of stock missing.
    lost_fields: bool,
    /// The preloaded side lost its connection (a backend crash).
    lost_connection: bool,
}

impl Report {
    fn kinds(&self) -> String {
        let count = |f: fn(&Hunk) -> bool| self.hunks.iter().filter(|h| f(h)).count();
        format!(
            "{} with Rust backtrace lines, {} missing stock's error fields (CONTEXT, QUERY, LINE, ... NAME), {} with a lost connection, {} other",
            count(|h| h.backtrace),
            count(|h| h.lost_fields),
            count(|h| h.lost_connection),
            count(|h| !h.backtrace && !h.lost_fields && !h.lost_connection)
        )
    }

    /// Differences, the rarer kinds first (lost connections, lost error
    /// fields, other, backtraces), each distinct set of changed lines once,
    /// as long as the budget of PRINT_LIMIT lines lasts.
    fn print_hunks(&self) {
        println!("differences (stock -, other +), each distinct change once, rarer kinds first:");
        let rank = |h: &Hunk| match (h.lost_connection, h.lost_fields, h.backtrace) {
            (true, _, _) => 0,
            (_, true, _) => 1,
            (_, _, false) => 2,
            _ => 3,
        };
        let mut order: Vec<&Hunk> = self.hunks.iter().collect();
        order.sort_by_key(|h| rank(h)); // stable: file order within a kind
        let mut seen: BTreeMap<String, (String, usize)> = BTreeMap::new();
        let mut printed = 0;
        for h in order {
            let changed: String = h
                .text
                .lines()
                .filter(|l| l.starts_with("- ") || l.starts_with("+ "))
                .collect::<Vec<_>>()
                .join("\n");
            if let Some((_, n)) = seen.get_mut(&changed) {
                *n += 1;
                continue;
            }
            seen.insert(changed, (h.file.clone(), 0));
            if printed >= PRINT_LIMIT {
                continue;
            }
            for line in h.text.lines().take(PRINT_LIMIT - printed) {
                println!("{line}");
                printed += 1;
            }
        }
        let repeats: usize = seen.values().map(|(_, n)| n).sum();
        println!(
            "({} distinct changes in {} hunks; {} hunks repeat a change shown or counted before)",
            seen.len(),
            self.hunks.len(),
            repeats
        );
    }
}

/// A line with every run of digits (and of hex digits holding one) as `#`.
fn shape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut run = String::new();
    let flush = |run: &mut String, out: &mut String| {
        if run.chars().any(|c| c.is_ascii_digit()) {
            out.push('#');
        } else {
            out.push_str(run);
        }
        run.clear();
    };
    for c in line.chars() {
        if c.is_ascii_hexdigit() {
            run.push(c);
        } else {
            flush(&mut run, &mut out);
            out.push(c);
        }
    }
    flush(&mut run, &mut out);
    out
}

/// Compares the preloaded output `p` with stock `a`, leaving out what
/// differs between the two stock runs `a` and `b`.
fn compare_file(key: &str, a: &[String], b: &[String], p: &[String], report: &mut Report) {
    let noise = diff_regions(a, b);
    let mut noisy_a = HashSet::new();
    let mut noisy_text: HashSet<&str> = HashSet::new();
    let mut excluded = 0;
    for r in &noise {
        for i in r.a.0..r.a.1 {
            noisy_a.insert(i);
            noisy_text.insert(&a[i]);
        }
        for j in r.b.0..r.b.1 {
            noisy_text.insert(&b[j]);
        }
        excluded += (r.a.1 - r.a.0) + (r.b.1 - r.b.0);
    }
    if excluded > 0 {
        report.noisy_files.push((key.to_string(), excluded));
        report.excluded_lines += excluded;
    }
    let mut differs = false;
    for r in diff_regions(a, p) {
        let a_side: Vec<usize> = (r.a.0..r.a.1).collect();
        let p_side = &p[r.b.0..r.b.1];
        let a_noisy = a_side
            .iter()
            .all(|&i| noisy_a.contains(&i) || noisy_text.contains(a[i].as_str()));
        let p_known = p_side.iter().all(|l| noisy_text.contains(l.as_str()));
        // Or line for line the same text but for its numbers (OIDs, timings,
        // counts that vary between the stock runs too): never another
        // message, another plan node or an error in place of a value.
        let same_shape = !a_side.is_empty()
            && p_side.len() == a_side.len()
            && a_side.iter().zip(p_side).all(|(&i, l)| shape(&a[i]) == shape(l));
        let explained = a_noisy && (p_known || same_shape);
        if explained {
            continue;
        }
        differs = true;
        let span = |(from, to): (usize, usize)| {
            if from == to {
                format!("after line {from}")
            } else {
                format!("lines {}-{to}", from + 1)
            }
        };
        let mut text = format!("--- {key}: stock {}, other {}\n", span(r.a), span(r.b));
        let ctx_start = r.a.0.saturating_sub(3);
        for l in &a[ctx_start..r.a.0] {
            text.push_str(&format!("  {}\n", clip(l)));
        }
        const HUNK_SIDE: usize = 25;
        for l in a[r.a.0..r.a.1].iter().take(HUNK_SIDE) {
            text.push_str(&format!("- {}\n", clip(l)));
        }
        if r.a.1 - r.a.0 > HUNK_SIDE {
            text.push_str(&format!("- ... {} more lines\n", r.a.1 - r.a.0 - HUNK_SIDE));
        }
        // A Rust backtrace shows as one line.
        let mut shown: Vec<String> = Vec::new();
        let mut frames = 0;
        for l in p_side {
            if is_backtrace_line(l) {
                frames += 1;
                continue;
            }
            if frames > 0 {
                shown.push(format!("[{frames} lines of a Rust backtrace]"));
                frames = 0;
            }
            shown.push(clip(l));
        }
        if frames > 0 {
            shown.push(format!("[{frames} lines of a Rust backtrace]"));
        }
        for l in shown.iter().take(HUNK_SIDE) {
            text.push_str(&format!("+ {l}\n"));
        }
        if shown.len() > HUNK_SIDE {
            text.push_str(&format!("+ ... {} more lines\n", shown.len() - HUNK_SIDE));
        }
        let field_line = |l: &String| {
            [
                "CONTEXT:",
                "QUERY:",
                "LINE ",
                "SCHEMA NAME:",
                "TABLE NAME:",
                "COLUMN NAME:",
                "DATATYPE NAME:",
                "CONSTRAINT NAME:",
            ]
            .iter()
            .any(|f| l.starts_with(f))
        };
        report.hunks.push(Hunk {
            file: key.to_string(),
            lines: a_side.len() + p_side.len(),
            text,
            backtrace: p_side.iter().any(|l| backtrace_in(l).is_some()),
            lost_fields: a[r.a.0..r.a.1].iter().any(|l| field_line(l) && !p_side.contains(l)),
            lost_connection: p_side
                .iter()
                .any(|l| l.contains("connection to server was lost") || l.contains("server closed the connection")),
        });
    }
    if differs {
        report.differing_files.push(key.to_string());
    }
}

fn clip(line: &str) -> String {
    if line.chars().count() > 200 {
        format!(
            "{}... ({} characters)",
            line.chars().take(200).collect::<String>(),
            line.chars().count()
        )
    } else {
        line.to_string()
    }
}

#[test]
fn the_comparison_finds_and_excludes_what_it_should() {
    let l = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(diff_regions(&l("a\nb\nc"), &l("a\nb\nc")), vec![]);
    assert_eq!(
        diff_regions(&l("a\nb\nc"), &l("a\nx\nc")),
        vec![Region { a: (1, 2), b: (1, 2) }]
    );
    assert_eq!(
        diff_regions(&l("a\nb\nc\nd"), &l("a\nc\nd\ne")),
        vec![Region { a: (1, 2), b: (1, 1) }, Region { a: (4, 4), b: (3, 4) }]
    );
    assert_eq!(diff_regions(&l(""), &l("x\ny")), vec![Region { a: (0, 0), b: (0, 2) }]);
    // A line that differs between the stock runs is excluded; another is not.
    let a = l("q1\n 17\nq2\nERROR: x\nCONTEXT: y");
    let b = l("q1\n 18\nq2\nERROR: x\nCONTEXT: y");
    let p = l("q1\n 19\nq2\nERROR: x");
    let mut report = Report::default();
    compare_file("t", &a, &b, &p, &mut report);
    assert_eq!(report.excluded_lines, 2);
    assert_eq!(report.differing_files, vec!["t".to_string()]);
    assert_eq!(report.hunks.len(), 1);
    assert!(report.hunks[0].text.contains("- CONTEXT: y"), "{}", report.hunks[0].text);
    // Normalization: directories, PIDs, timings, repeated CONTEXT lines.
    let mut text = String::from("x /tmp/s1/data y\nwaits for PID 1234.\nExecution Time: 0.123 ms\n");
    for _ in 0..30 {
        text.push_str("SQL function \"r\" statement 1\n");
    }
    text.push_str("end\n");
    let n = normalize(&text, "/tmp/s1");
    assert_eq!(
        n[..4],
        [
            "x <SERVERDIR>/data y",
            "waits for PID <PID>.",
            "Execution Time: <TIME> ms",
            "SQL function \"r\" statement 1"
        ]
    );
    assert_eq!(n[4..], ["<the line above repeats>", "end"]);
    let short: String = (0..5).map(|_| "SQL function \"r\" statement 1\n").collect();
    assert_eq!(normalize(&short, "/x").len(), 5);
}

// ---------------------------------------------------------------------------
// Error reports: no backtrace, the same fields as stock

/// The fields that differ, one line each, clipped.
fn field_diff(stock: &ErrorFields, preloaded: &ErrorFields) -> String {
    stock
        .pairs()
        .into_iter()
        .zip(preloaded.pairs())
        .filter(|(a, b)| a.1 != b.1)
        .map(|((name, a), (_, b))| format!("    {name}: stock {}\n    {name}: preloaded {}", clip(&a), clip(&b)))
        .collect::<Vec<_>>()
        .join("\n")
}

impl ErrorFields {
    fn pairs(&self) -> Vec<(&'static str, String)> {
        vec![
            ("severity", format!("{:?}", self.severity)),
            ("code", format!("{:?}", self.code)),
            ("message", format!("{:?}", self.message)),
            ("detail", format!("{:?}", self.detail)),
            ("hint", format!("{:?}", self.hint)),
            ("position", format!("{:?}", self.position)),
            ("context", format!("{:?}", self.context)),
            ("schema", format!("{:?}", self.schema)),
            ("table", format!("{:?}", self.table)),
            ("column", format!("{:?}", self.column)),
            ("datatype", format!("{:?}", self.datatype)),
            ("constraint", format!("{:?}", self.constraint)),
            ("file", format!("{:?}", self.file)),
            ("line", format!("{:?}", self.line)),
            ("routine", format!("{:?}", self.routine)),
        ]
    }
}

fn check_no_backtrace(sql: &str, r: &ErrorFields, failures: &mut Vec<String>) {
    let texts = [
        Some(&r.message),
        r.detail.as_ref(),
        r.hint.as_ref(),
        r.context.as_ref(),
        r.position.as_ref(),
    ];
    for t in texts.into_iter().flatten() {
        if let Some(why) = backtrace_in(t) {
            failures.push(format!("{sql}: the error report {why}: {}", clip(&t.replace('\n', "\\n"))));
        }
    }
}

/// Every field of an error report, as the client receives it.
#[derive(Debug, PartialEq, Eq, Clone)]
struct ErrorFields {
    severity: String,
    code: String,
    message: String,
    detail: Option<String>,
    hint: Option<String>,
    position: Option<String>,
    context: Option<String>,
    schema: Option<String>,
    table: Option<String>,
    column: Option<String>,
    datatype: Option<String>,
    constraint: Option<String>,
    file: Option<String>,
    line: Option<u32>,
    routine: Option<String>,
}

fn fields(e: &DbError) -> ErrorFields {
    ErrorFields {
        severity: e.severity().to_string(),
        code: e.code().code().to_string(),
        message: e.message().to_string(),
        detail: e.detail().map(str::to_string),
        hint: e.hint().map(str::to_string),
        position: e.position().map(|p| match p {
            ErrorPosition::Original(n) => format!("{n}"),
            ErrorPosition::Internal { position, query } => format!("{position} in internal query {query:?}"),
        }),
        context: e.where_().map(str::to_string),
        schema: e.schema().map(str::to_string),
        table: e.table().map(str::to_string),
        column: e.column().map(str::to_string),
        datatype: e.datatype().map(str::to_string),
        constraint: e.constraint().map(str::to_string),
        file: e.file().map(str::to_string),
        line: e.line(),
        routine: e.routine().map(str::to_string),
    }
}

/// A line of a printed Rust backtrace: "   3: std::panicking::begin_panic"
/// or the "             at ./src/x.rs:1:2" under it.
fn is_backtrace_line(line: &str) -> bool {
    let t = line.trim_start();
    let indent = line.len() - t.len();
    (indent > 0
        && t.split_once(": ")
            .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
        || (indent >= 8 && t.starts_with("at "))
}

/// What gives a Rust backtrace or panic away in an error report's text.
fn backtrace_in(text: &str) -> Option<String> {
    for marker in [
        "stack backtrace",
        "backtrace",
        "at src/",
        ".rs:",
        "panicked",
        "rust_begin_unwind",
        "pgrx",
    ] {
        if text.to_lowercase().contains(marker) {
            return Some(format!("contains {marker:?}"));
        }
    }
    text.lines()
        .find(|l| is_backtrace_line(l))
        .map(|l| format!("has a backtrace frame line {l:?}"))
}

fn error_of(c: &mut Client, sql: &str) -> Option<ErrorFields> {
    match c.batch_execute(sql) {
        Ok(()) => None,
        Err(e) => Some(fields(
            e.as_db_error().unwrap_or_else(|| panic!("{sql}: not a server error: {e}")),
        )),
    }
}

const ERROR_SETUP: &str = "
    CREATE FUNCTION inl_div(int) RETURNS int LANGUAGE sql IMMUTABLE AS 'SELECT 10 / $1';
    CREATE FUNCTION pl_div(a int) RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$ BEGIN RETURN 10 / a; END $$;
    CREATE FUNCTION pl_exec() RETURNS int LANGUAGE plpgsql IMMUTABLE AS $$
        DECLARE r int; BEGIN EXECUTE 'SELECT 1 +* 2' INTO r; RETURN r; END $$;
    CREATE DOMAIN positive AS int CONSTRAINT positive_check CHECK (VALUE > 0);
    CREATE FUNCTION to_positive(int) RETURNS positive LANGUAGE sql IMMUTABLE AS 'SELECT $1::positive';
    SET check_function_bodies = off;
    CREATE FUNCTION bad_body() RETURNS int LANGUAGE sql AS 'SELECT 1 +* 2';
    RESET check_function_bodies;";

/// Errors raised while planning, none of them pg_idgen's.
const PLANNING_ERRORS: &[&str] = &[
    "SELECT 1/0",
    "SELECT log(-1)",
    "SELECT log(-12.34)",
    "SELECT sqrt(-1::float8)",
    "SELECT inl_div(0)",
    "SELECT pl_div(0)",
    "SELECT pl_exec()",
    "SELECT bad_body()",
    "SELECT to_positive(-1)",
    "SELECT x FROM generate_series(1, 3) x WHERE x > 1/0",
    "DO $$ BEGIN PERFORM pl_div(0); END $$",
    "SELECT 1 + 'x'::int",
];

/// pg_idgen's own errors on a server where it is preloaded: (SQL, SQLSTATE,
/// message, detail, hint). The decoding ones are IMMUTABLE, so a constant
/// argument raises them while planning.
const EXTENSION_ERRORS: &[(&str, &str, &str, Option<&str>, Option<&str>)] = &[
    (
        "SELECT next_shard_id(9999)",
        "22003",
        "shard 9999 is out of range 0 to 8191",
        None,
        None,
    ),
    (
        "SELECT id_shard(-1)",
        "22003",
        "ID -1 is out of range",
        Some("pg_idgen IDs are never negative."),
        None,
    ),
    (
        "SELECT id_from_parts(now(), 1, 5000)",
        "22003",
        "sequence number 5000 is out of range 0 to 1023",
        None,
        None,
    ),
    (
        "SELECT id_public(1)",
        "55000",
        "pg_idgen.public_id_key is not set",
        None,
        Some("Set it to 32 hexadecimal digits (a 128-bit key) in postgresql.conf; only superusers can read it."),
    ),
];

#[test]
fn error_reports_carry_no_backtrace_and_match_stock() {
    let env = [("RUST_BACKTRACE", "1")];
    let (stock, preloaded) = std::thread::scope(|s| {
        let a = s.spawn(|| Server::init_env("bt-stock", &[], &env));
        let b = s.spawn(|| Server::init_env("bt-preloaded", &[PRELOAD], &env));
        (a.join().unwrap(), b.join().unwrap())
    });
    let mut sc = stock.client();
    let mut pc = preloaded.client();
    // The stock server gets the extension too (it installs without the
    // preload), so that its decoding functions' errors compare as well.
    for c in [&mut sc, &mut pc] {
        c.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        c.batch_execute(ERROR_SETUP).unwrap();
    }
    let mut failures = Vec::new();
    for sql in PLANNING_ERRORS
        .iter()
        .chain(["SELECT id_shard(-1)", "DO $$ BEGIN PERFORM id_shard(-2); END $$"].iter())
    {
        let s = error_of(&mut sc, sql).unwrap_or_else(|| panic!("{sql} succeeded on stock"));
        let Some(p) = error_of(&mut pc, sql) else {
            failures.push(format!("{sql}: no error with the preload (stock: {} {})", s.code, s.message));
            continue;
        };
        check_no_backtrace(sql, &p, &mut failures);
        if p != s {
            failures.push(format!("{sql}: the error report differs from stock:\n{}", field_diff(&s, &p)));
        }
        println!(
            "{sql}: {} {} | detail {:?} | context {:?}",
            p.code,
            p.message,
            p.detail.as_deref().map(clip),
            p.context
        );
    }
    for &(sql, code, message, detail, hint) in EXTENSION_ERRORS {
        let Some(p) = error_of(&mut pc, sql) else {
            failures.push(format!("{sql}: no error"));
            continue;
        };
        check_no_backtrace(sql, &p, &mut failures);
        let got = (
            p.code.as_str(),
            p.message.as_str(),
            p.detail.as_deref(),
            p.hint.as_deref(),
            p.context.as_deref(),
        );
        if got != (code, message, detail, hint, None) {
            failures.push(format!(
                "{sql}: expected {code} {message:?} detail {detail:?} hint {hint:?} and no context, got {} {:?} detail {:?} hint {:?} context {:?}",
                p.code,
                p.message,
                p.detail.as_deref().map(clip),
                p.hint,
                p.context
            ));
        }
        println!("{sql}: {} {} | detail {:?}", p.code, p.message, p.detail.as_deref().map(clip));
    }
    // The sessions still work.
    for c in [&mut sc, &mut pc] {
        assert_eq!(c.query_one("SELECT 41 + 1", &[]).unwrap().get::<_, i32>(0), 42);
    }
    let log = preloaded.log();
    let log_backtraces = log
        .lines()
        .filter(|l| l.contains("stack backtrace") || l.contains("panicked"))
        .count();
    println!("preloaded server log: {log_backtraces} lines with a backtrace or panic (not asserted)");
    for f in &failures {
        println!("FAILED: {f}");
    }
    assert!(
        failures.is_empty(),
        "{} failures (printed above): error reports differ from stock or carry a backtrace:\n{}",
        failures.len(),
        failures
            .iter()
            .map(|f| f.lines().next().unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

// ---------------------------------------------------------------------------
// Caught planning-time errors leak nothing

const LEAK_ERRORS: usize = 100_000;
const LEAK_BATCH: usize = 10_000;
const LEAK_TOLERANCE: i64 = 256 * 1024;
const LEAK_TIME_LIMIT: Duration = Duration::from_secs(240);

#[derive(Debug, Clone, Copy)]
struct Memory {
    /// Sum of total_bytes over pg_backend_memory_contexts.
    contexts: i64,
    /// VmRSS and RssAnon of the backend, in bytes.
    rss: i64,
    rss_anon: i64,
}

fn memory(c: &mut Client, pid: i32) -> Memory {
    let contexts: i64 = c
        .query_one("SELECT sum(total_bytes)::bigint FROM pg_backend_memory_contexts", &[])
        .unwrap()
        .get(0);
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc/<backend>/status (tests run on the server's host)");
    let kb = |field: &str| -> i64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<i64>().ok())
            .map(|v| v * 1024)
            .unwrap_or_else(|| panic!("{field} in /proc/{pid}/status"))
    };
    Memory {
        contexts,
        rss: kb("VmRSS:"),
        rss_anon: kb("RssAnon:"),
    }
}

/// (before, after, errors caught, seconds) of LEAK_ERRORS caught `SELECT 1/0` in one backend.
fn catch_planning_errors(server: &Server) -> (Memory, Memory, usize, f64) {
    let mut c = server.client();
    c.batch_execute("SET statement_timeout = '300s'").unwrap();
    let pid: i32 = c.query_one("SELECT pg_backend_pid()", &[]).unwrap().get(0);
    let block = |n: usize| {
        format!(
            "DO $$ BEGIN FOR i IN 1..{n} LOOP BEGIN EXECUTE 'SELECT 1/0'; EXCEPTION WHEN division_by_zero THEN NULL; END; END LOOP; END $$"
        )
    };
    // Warm up the caches first (and what the first error allocates once).
    c.batch_execute(&block(2000)).unwrap();
    let before = memory(&mut c, pid);
    let started = Instant::now();
    let mut done = 0;
    while done < LEAK_ERRORS && started.elapsed() < LEAK_TIME_LIMIT {
        c.batch_execute(&block(LEAK_BATCH)).unwrap();
        done += LEAK_BATCH;
    }
    let after = memory(&mut c, pid);
    (before, after, done, started.elapsed().as_secs_f64())
}

#[test]
fn caught_planning_errors_do_not_leak() {
    // RUST_BACKTRACE=0: this measures memory, not backtraces (tested above),
    // and keeps each caught error cheap.
    let env = [("RUST_BACKTRACE", "0")];
    let ((sb, sa, sn, st), (pb, pa, pn, pt)) = std::thread::scope(|s| {
        let stock = s.spawn(|| {
            let server = Server::init_env("leak-stock", &[], &env);
            catch_planning_errors(&server)
        });
        let preloaded = s.spawn(|| {
            let server = Server::init_env("leak-preloaded", &[PRELOAD], &env);
            server.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
            catch_planning_errors(&server)
        });
        (stock.join().unwrap(), preloaded.join().unwrap())
    });
    let growth = |b: Memory, a: Memory| (a.contexts - b.contexts, a.rss - b.rss, a.rss_anon - b.rss_anon);
    let (s_ctx, s_rss, s_anon) = growth(sb, sa);
    let (p_ctx, p_rss, p_anon) = growth(pb, pa);
    println!("stock:     {sn} errors caught in {st:.1} s; memory contexts {s_ctx:+} bytes, VmRSS {s_rss:+} bytes, RssAnon {s_anon:+} bytes ({sb:?} -> {sa:?})");
    println!("preloaded: {pn} errors caught in {pt:.1} s; memory contexts {p_ctx:+} bytes, VmRSS {p_rss:+} bytes, RssAnon {p_anon:+} bytes ({pb:?} -> {pa:?})");
    assert_eq!(sn, LEAK_ERRORS, "stock caught only {sn} errors in {LEAK_TIME_LIMIT:?}");
    let mut failures = Vec::new();
    if pn < LEAK_ERRORS {
        failures.push(format!(
            "the preloaded backend caught only {pn} of {LEAK_ERRORS} errors in {pt:.0} s (stock: {st:.1} s)"
        ));
    }
    // Scaled to what was done, when the time ran out.
    let scale = |v: i64| v * LEAK_ERRORS as i64 / pn.max(1) as i64;
    for (what, s, p) in [("memory contexts", s_ctx, scale(p_ctx)), ("VmRSS", s_rss, scale(p_rss))] {
        if p > s.max(0) + LEAK_TOLERANCE {
            failures.push(format!(
                "{what} grew by {p} bytes per {LEAK_ERRORS} caught planning errors with the preload, {s} on stock (tolerance {LEAK_TOLERANCE})"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------
// Deep expressions: stock's result or SQLSTATE, no crash

fn deep_statements() -> Vec<(&'static str, String)> {
    let sum = |n: usize| vec!["1"; n].join("+");
    let nested = |n: usize| format!("{}1{}", "1+(".repeat(n - 1), ")".repeat(n - 1));
    vec![
        ("sum of 800 ones", format!("SELECT {}", sum(800))),
        ("sum of 5000 ones", format!("SELECT {}", sum(5000))),
        ("1+(1+(...)) 800 deep", format!("SELECT {}", nested(800))),
        (
            "'a'||'a'... 1000 terms",
            format!("SELECT length({})", vec!["'a'"; 1000].join("||")),
        ),
        (
            "800 ones in WHERE",
            format!("SELECT count(*) FROM generate_series(1, 3) g WHERE g + {} > 800", sum(800)),
        ),
        (
            "5000 ones in WHERE",
            format!("SELECT count(*) FROM generate_series(1, 3) g WHERE g + {} > 800", sum(5000)),
        ),
        (
            "800 deep in JOIN ON",
            format!(
                "SELECT count(*) FROM generate_series(1, 3) a JOIN generate_series(1, 3) b ON a = b - 800 + {}",
                nested(800)
            ),
        ),
        ("recursive SQL function r()", "SELECT r()".into()),
    ]
}

/// The outcome of one statement on a fresh connection: its first value, or
/// its SQLSTATE and message (not the CONTEXT, whose length depends on
/// the stack each level takes); Err for a broken connection.
fn outcome(server: &Server, sql: &str) -> Result<String, String> {
    let mut c = server.client();
    c.batch_execute(&format!("SET statement_timeout = '{STATEMENT_TIMEOUT}'"))
        .unwrap();
    match c.simple_query(sql) {
        Ok(msgs) => Ok(msgs
            .iter()
            .find_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("NULL").to_string()),
                _ => None,
            })
            .unwrap_or_default()),
        Err(e) => match e.as_db_error() {
            Some(db) => Ok(format!("ERROR {} {}", db.code().code(), db.message())),
            None => Err(format!("connection lost: {e}")),
        },
    }
}

fn postmaster_pid(server: &Server) -> String {
    std::fs::read_to_string(Path::new(&server.data()).join("postmaster.pid"))
        .unwrap_or_default()
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

#[test]
fn deep_expressions_give_stocks_result_without_a_crash() {
    // Without backtraces (as by default): the crash must not depend on them.
    let env = [("RUST_BACKTRACE", "0")];
    let (stock, preloaded) = std::thread::scope(|s| {
        let a = s.spawn(|| Server::init_env("deep-stock", &[], &env));
        let b = s.spawn(|| Server::init_env("deep-preloaded", &[PRELOAD], &env));
        (a.join().unwrap(), b.join().unwrap())
    });
    preloaded.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    for server in [&stock, &preloaded] {
        server
            .client()
            .batch_execute("CREATE FUNCTION r() RETURNS int AS 'SELECT r()' LANGUAGE sql")
            .unwrap();
    }
    let start_time = |s: &Server| -> String {
        s.client()
            .query_one("SELECT pg_postmaster_start_time()::text", &[])
            .unwrap()
            .get(0)
    };
    let (pid0, started0) = (postmaster_pid(&preloaded), start_time(&preloaded));
    let mut failures = Vec::new();
    let mut log_offset = read_log_from(&preloaded, 0).1;
    for (name, sql) in deep_statements() {
        let expected = outcome(&stock, &sql);
        assert!(expected.is_ok(), "{name}: stock lost its connection: {expected:?}");
        // A session open across the statement: a crash of any backend ends it
        // (the postmaster resets every session), even though the postmaster's
        // PID and start time stay the same through the crash recovery.
        let mut sentinel = preloaded.client();
        let got = outcome(&preloaded, &sql);
        if got.is_err() {
            // The connection broke: give the postmaster (bounded) time to see
            // its child die and log it, then to finish the crash recovery.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !read_log_from(&preloaded, log_offset).0.lines().any(is_crash_line) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        assert!(
            wait_ready(&preloaded, Duration::from_secs(60)),
            "the preloaded server did not come back"
        );
        let sentinel_alive = sentinel.simple_query("SELECT 1").is_ok();
        let (log, next) = read_log_from(&preloaded, log_offset);
        log_offset = next;
        let crash: Vec<&str> = log.lines().filter(|l| is_crash_line(l)).collect();
        let pid = postmaster_pid(&preloaded);
        println!(
            "{name}: stock {:?} | preloaded {:?}",
            expected.as_ref().map(|s| clip(s)),
            got.as_ref().map(|s| clip(s))
        );
        if got != expected {
            failures.push(format!(
                "{name}: stock gives {:?}, the preloaded server {:?}",
                expected.unwrap(),
                got
            ));
        }
        if !sentinel_alive || !crash.is_empty() || pid != pid0 {
            failures.push(format!(
                "{name}: the preloaded server crashed (other session survived: {sentinel_alive}; postmaster PID {pid0} -> {pid}; log: {:?})",
                crash.iter().map(|l| clip(l)).collect::<Vec<_>>()
            ));
        }
    }
    let started1 = start_time(&preloaded);
    println!(
        "postmaster PID {pid0} -> {}, start time {started0} -> {started1}",
        postmaster_pid(&preloaded)
    );
    if started1 != started0 {
        failures.push(format!("the postmaster restarted: start time {started0} -> {started1}"));
    }
    for f in &failures {
        println!("FAILED: {f}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
