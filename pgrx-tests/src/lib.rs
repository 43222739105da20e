//! A harness for end-to-end tests: real PostgreSQL servers with pg_idgen
//! installed (by `cargo pgrx install`), each in a directory of its own,
//! listening on a Unix socket there and on no TCP address, run as the
//! `postgres` user when the tests run as root, and always stopped when the
//! handle is dropped, even when a test fails. Its files are removed then
//! too, unless `PG_IDGEN_E2E_KEEP` is set.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub use postgres;

pub mod citus;
pub mod etcd;
pub mod patroni;
use postgres::{Client, NoTls};

/// The port number names the socket file; with no TCP listener it only has
/// to differ from the default.
pub const PORT: u16 = 5499;

static SERVERS: AtomicUsize = AtomicUsize::new(0);

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc_geteuid() == 0 }
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

/// Runs a program as the server's owner: `postgres` when we are root.
fn as_owner(program: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", program]);
        c
    } else {
        Command::new(program)
    }
}

fn check(what: &str, out: std::io::Result<Output>) -> Output {
    let out = out.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// What `pg_config` (or `$PG_CONFIG`) of the installation under test says for `arg`.
pub fn pg_config(arg: &str) -> PathBuf {
    let pg_config = std::env::var("PG_CONFIG").unwrap_or_else(|_| "pg_config".into());
    let out = check(&format!("pg_config {arg}"), Command::new(&pg_config).arg(arg).output());
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// PostgreSQL's program directory.
pub fn bindir() -> PathBuf {
    pg_config("--bindir")
}

/// A program of the PostgreSQL installation under test.
pub fn bin(name: &str) -> String {
    bindir().join(name).to_string_lossy().into_owned()
}

/// A running server. Dropping it stops the server and removes its files.
pub struct Server {
    pub dir: PathBuf,
    /// The program directory of the installation it runs from.
    bindir: PathBuf,
    /// Environment for the server process (a shifted clock).
    env: Vec<(String, String)>,
    running: bool,
}

impl Server {
    /// A new cluster with pg_idgen preloaded and the extension created in
    /// database `postgres`, plus any further `postgresql.conf` lines.
    pub fn start(name: &str, conf: &[&str]) -> Server {
        let mut lines = vec!["shared_preload_libraries = 'pg_idgen'"];
        lines.extend_from_slice(conf);
        let server = Server::init(name, &lines);
        server.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        server
    }


    /// A new cluster with these `postgresql.conf` lines, not started.
    pub fn init_stopped(name: &str, conf: &[&str]) -> Server {
        let server = Server::new_dir(name);
        server.initdb(conf);
        server
    }

    /// Runs a program of the installation as the server's owner, in this server's directory.
    pub fn run_as_owner(&self, program: &str, args: &[&str]) -> Output {
        let mut c = as_owner(&self.bin(program));
        c.args(args).current_dir(&self.dir);
        check(program, c.output())
    }

    /// The same, its outcome returned whatever it is.
    pub fn run_as_owner_unchecked(&self, program: &str, args: &[&str]) -> Output {
        let mut c = as_owner(&self.bin(program));
        c.args(args).current_dir(&self.dir);
        c.output().unwrap_or_else(|e| panic!("{program}: {e}"))
    }

    /// A program of the installation this server runs from.
    fn bin(&self, name: &str) -> String {
        self.bindir.join(name).to_string_lossy().into_owned()
    }

    /// A new cluster like [`Server::init`], run from the installation whose
    /// programs are in `bindir`.
    pub fn init_in(bindir: &Path, name: &str, conf: &[&str]) -> Server {
        let mut server = Server::init_stopped_in(bindir, name, conf);
        server.start_process();
        server
    }

    /// The same, not started.
    pub fn init_stopped_in(bindir: &Path, name: &str, conf: &[&str]) -> Server {
        let mut server = Server::new_dir(name);
        server.bindir = bindir.to_path_buf();
        server.initdb(conf);
        server
    }

    /// The program directory of the installation it runs from.
    pub fn bindir(&self) -> &Path {
        &self.bindir
    }

    /// A new cluster with exactly these `postgresql.conf` lines and server environment.
    pub fn init(name: &str, conf: &[&str]) -> Server {
        let mut server = Server::new_dir(name);
        server.initdb(conf);
        server.start_process();
        server
    }

    /// Like [`Server::init`], with these variables added to the environment
    /// the server processes inherit (such as `RUST_BACKTRACE`).
    pub fn init_env(name: &str, conf: &[&str], env: &[(&str, &str)]) -> Server {
        let mut server = Server::new_dir(name);
        server.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        server.initdb(conf);
        server.start_process();
        server
    }

    fn initdb(&self, conf: &[&str]) {
        let server = self;
        check(
            "initdb",
            as_owner(&server.bin("initdb"))
                .args(["-D", &server.data(), "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C"])
                .output(),
        );
        let mut all = vec![
            format!("port = {PORT}"),
            "listen_addresses = ''".into(),
            format!("unix_socket_directories = '{}'", server.dir.display()),
            "fsync = off".into(),
            "max_connections = 40".into(),
        ];
        all.extend(conf.iter().map(|s| s.to_string()));
        server.append_conf(&all.join("\n"));
    }

    /// A new cluster like [`Server::start`] whose clock libfaketime shifts by
    /// the offset in a file, which [`Server::set_clock`] rewrites while it runs.
    pub fn start_with_clock(name: &str, conf: &[&str]) -> Server {
        let mut lines = vec!["shared_preload_libraries = 'pg_idgen'"];
        lines.extend_from_slice(conf);
        let server = Server::init_with_clock(name, &lines);
        server.client().batch_execute("CREATE EXTENSION pg_idgen").unwrap();
        server
    }

    /// A new cluster like [`Server::init`] on a clock file, as
    /// [`Server::start_with_clock`] has, without creating the extension.
    pub fn init_with_clock(name: &str, conf: &[&str]) -> Server {
        let mut server = Server::new_dir(name);
        server.use_clock_file();
        server.initdb(conf);
        server.start_process();
        server
    }

    /// A streaming standby of `primary`, made with `pg_basebackup -R`, on its
    /// own clock file; `conf` lines are added to what it copied from the primary.
    pub fn standby_of(primary: &Server, name: &str, conf: &[&str]) -> Server {
        Server::base_backup_of(primary, name, conf, true)
    }

    /// An independent copy of `primary` made with `pg_basebackup` while it
    /// runs (a cloned machine, a restored snapshot), started as a server of
    /// its own on its own clock file; `conf` lines are added to what it copied.
    pub fn clone_of(primary: &Server, name: &str, conf: &[&str]) -> Server {
        Server::base_backup_of(primary, name, conf, false)
    }

    fn base_backup_of(primary: &Server, name: &str, conf: &[&str], standby: bool) -> Server {
        let mut server = Server::new_dir(name);
        server.use_clock_file();
        let data = server.data();
        let source = primary.conninfo("postgres");
        // An immediate checkpoint: a spread one sleeps 100 ms per dirty
        // buffer written ahead of schedule, a minute here.
        let mut args = vec!["-D", &data, "-X", "stream", "-c", "fast", "-U", "postgres", "-d", &source];
        if standby {
            args.push("-R");
        }
        check("pg_basebackup", as_owner(&server.bin("pg_basebackup")).args(&args).output());
        let mut all = vec![format!("unix_socket_directories = '{}'", server.dir.display())];
        all.extend(conf.iter().map(|s| s.to_string()));
        server.append_conf(&all.join("\n"));
        server.start_process();
        server
    }

    /// The postmaster's process ID and its children's.
    fn processes(&self) -> Vec<String> {
        let pid = std::fs::read_to_string(Path::new(&self.data()).join("postmaster.pid")).unwrap_or_default();
        let pid = pid.lines().next().unwrap_or("").trim().to_string();
        assert!(!pid.is_empty(), "no postmaster.pid: the server is not running");
        let children = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
        let mut all = vec![pid];
        all.extend(String::from_utf8_lossy(&children.stdout).split_whitespace().map(str::to_string));
        all
    }

    /// Stops every process of the server (SIGSTOP), as a paused machine would be.
    pub fn freeze(&self) {
        check("kill -STOP", Command::new("kill").arg("-STOP").args(self.processes()).output());
    }

    /// Lets them run again (SIGCONT).
    pub fn thaw(&self) {
        check("kill -CONT", Command::new("kill").arg("-CONT").args(self.processes()).output());
    }

    fn use_clock_file(&mut self) {
        let file = self.dir.join("faketime").to_string_lossy().into_owned();
        std::fs::write(&file, "+0\n").unwrap();
        self.env = faketime_env(&file);
    }

    /// Shifts the server's clock by `offset` (libfaketime syntax, such as
    /// `-600s`); every process of the server reads it by the time this returns.
    pub fn set_clock(&self, offset: &str) {
        let file = self.env.iter().find(|(k, _)| k == "FAKETIME_TIMESTAMP_FILE").expect("a server with a clock file");
        write_clock(Path::new(&file.1), offset);
    }

    /// Waits (at most a minute) until this standby has replayed everything
    /// `primary` has written so far.
    pub fn wait_for_replay(&self, primary: &Server) {
        let lsn: String = primary.client().query_one("SELECT pg_current_wal_lsn()::text", &[]).unwrap().get(0);
        let mut c = self.client();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !c.query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&lsn]).unwrap().get::<_, bool>(0) {
            assert!(Instant::now() < deadline, "the standby did not replay {lsn}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Promotes a standby and waits until it accepts writes.
    pub fn promote(&self) {
        check("pg_ctl promote", Ok(self.pg_ctl(&["promote"])));
    }

    pub fn data(&self) -> String {
        self.dir.join("data").to_string_lossy().into_owned()
    }

    /// A server handle on a new, empty directory, owned by the server's user.
    fn new_dir(name: &str) -> Server {
        let n = SERVERS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("pg_idgen_e2e/{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for d in [dir.parent().unwrap(), &dir] {
            check("chmod", Command::new("chmod").arg("0755").arg(d).output());
        }
        if is_root() {
            check("chown", Command::new("chown").args(["postgres:postgres"]).arg(&dir).output());
        }
        Server { dir, bindir: bindir(), env: Vec::new(), running: false }
    }

    pub fn append_conf(&self, text: &str) {
        use std::io::Write;
        let path = Path::new(&self.data()).join("postgresql.conf");
        let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
        writeln!(f, "\n{text}").unwrap();
    }

    fn pg_ctl(&self, args: &[&str]) -> Output {
        let log = self.dir.join("server.log").to_string_lossy().into_owned();
        let mut c = as_owner(&self.bin("pg_ctl"));
        c.args(["-D", &self.data(), "-l", &log, "-w", "-t", "60"]).args(args);
        c.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        c.output().unwrap()
    }

    pub fn start_process(&mut self) {
        let out = self.pg_ctl(&["start"]);
        if !out.status.success() {
            panic!(
                "server did not start ({}): pg_ctl said:\n{}{}\nserver log:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
        }
        self.running = true;
    }

    /// Restarts after a clean shutdown.
    pub fn restart(&mut self) {
        self.stop("fast");
        self.start_process();
    }

    /// Stops with the given mode (`fast`, or `immediate` to simulate a crash).
    pub fn stop(&mut self, mode: &str) {
        if self.running {
            self.pg_ctl(&["stop", "-m", mode]);
            self.running = false;
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn conninfo(&self, db: &str) -> String {
        format!("host={} port={PORT} user=postgres dbname={db}", self.dir.display())
    }

    pub fn client(&self) -> Client {
        self.client_db("postgres")
    }

    pub fn client_db(&self, db: &str) -> Client {
        self.client_as(db, "postgres")
    }

    /// A session of role `user` in database `db`.
    pub fn client_as(&self, db: &str, user: &str) -> Client {
        connect(&format!("host={} port={PORT} user={user} dbname={db}", self.dir.display()), || self.log())
    }

    /// One attempt at a session of role `user` in database `db`.
    pub fn try_client_as(&self, db: &str, user: &str) -> Result<Client, postgres::Error> {
        Client::connect(&format!("host={} port={PORT} user={user} dbname={db}", self.dir.display()), NoTls)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop("immediate");
        if std::env::var_os("PG_IDGEN_E2E_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A private copy of the PostgreSQL installation under test (hard links,
/// as scripts/pgtree makes, of the directory `PG_IDGEN_TEST_ROOT` names),
/// for a test that installs other files of pg_idgen into it. Removed when dropped.
pub struct Installation {
    root: PathBuf,
    pub bindir: PathBuf,
    pub pkglibdir: PathBuf,
    pub extensiondir: PathBuf,
}

impl Installation {
    pub fn copy(name: &str) -> Installation {
        let source = PathBuf::from(
            std::env::var("PG_IDGEN_TEST_ROOT").expect("PG_IDGEN_TEST_ROOT names the test installation's root: run the suite with scripts/test"),
        );
        let root = std::env::temp_dir().join(format!("pg_idgen_e2e/{name}-install-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.parent().unwrap()).unwrap();
        check("cp -al", Command::new("cp").arg("-al").arg(&source).arg(&root).output());
        let moved = |p: PathBuf| root.join(p.strip_prefix(&source).unwrap_or_else(|_| panic!("{} is outside {}", p.display(), source.display())));
        Installation {
            bindir: moved(bindir()),
            pkglibdir: moved(pg_config("--pkglibdir")),
            extensiondir: moved(pg_config("--sharedir").join("extension")),
            root,
        }
    }

    /// Installs pg_idgen's files from a directory holding `lib/` and
    /// `extension/` (as a tarball and scripts/previous-release lay them
    /// out), each removed first, so that nothing is written through a hard link.
    pub fn install(&self, from: &Path) {
        for (dir, to) in [("lib", &self.pkglibdir), ("extension", &self.extensiondir)] {
            for entry in std::fs::read_dir(from.join(dir)).unwrap() {
                let f = entry.unwrap().path();
                let dest = to.join(f.file_name().unwrap());
                let _ = std::fs::remove_file(&dest);
                std::fs::copy(&f, &dest).unwrap();
            }
        }
        check("chmod", Command::new("chmod").arg("-R").arg("a+rX").arg(&self.root).output());
    }
}

impl Drop for Installation {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Unpacks a release package (the Debian package or a tarball) into `into`,
/// and returns the directory of its `lib/` and `extension/` (for the Debian
/// package, a directory of links to them).
pub fn unpack_package(pkg: &Path, into: &Path) -> PathBuf {
    let _ = std::fs::remove_dir_all(into);
    std::fs::create_dir_all(into).unwrap();
    if pkg.extension().is_some_and(|e| e == "deb") {
        check("dpkg-deb -x", Command::new("dpkg-deb").arg("-x").arg(pkg).arg(into).output());
        let major = pg_config("--version").to_string_lossy().split_whitespace().nth(1).unwrap().split('.').next().unwrap().to_string();
        let top = into.join("layout");
        std::fs::create_dir_all(&top).unwrap();
        std::os::unix::fs::symlink(into.join(format!("usr/lib/postgresql/{major}/lib")), top.join("lib")).unwrap();
        std::os::unix::fs::symlink(into.join(format!("usr/share/postgresql/{major}/extension")), top.join("extension")).unwrap();
        top
    } else {
        check("tar", Command::new("tar").arg("-C").arg(into).arg("-xzf").arg(pkg).output());
        std::fs::read_dir(into).unwrap().next().unwrap().unwrap().path()
    }
}

/// A session on `conninfo`, retried for up to 30 s while the server starts;
/// fails the test with the error and what `context` says (a server log).
fn connect(conninfo: &str, context: impl FnOnce() -> String) -> Client {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match Client::connect(conninfo, NoTls) {
            Ok(c) => return c,
            Err(e) if Instant::now() >= deadline => panic!("cannot connect to {conninfo}: {e}\n{}", context()),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Debian's libfaketime, which shifts a server's clock.
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How a server's processes read their clock file: at the first clock
/// reading of each wall-clock second, not at every reading
/// (`FAKETIME_NO_CACHE`). libfaketime reads the file with `fopen`, which
/// allocates, also inside a signal handler that reads the clock
/// (PostgreSQL's `SIGALRM` handler does): read at every reading, a timeout
/// that interrupted `malloc` corrupted the heap (a backend aborted in
/// `malloc()` or at exit, about one run in ten of a test whose sessions
/// time out every 250 ms, under load). Read once a second, the handler is
/// seldom the reading that reads it.
pub const FAKETIME_CACHE: &str = "FAKETIME_CACHE_DURATION=0";

/// The environment that runs a server under libfaketime with the offset in `file`.
fn faketime_env(file: &str) -> Vec<(String, String)> {
    assert!(Path::new(FAKETIME_LIB).exists(), "{FAKETIME_LIB} is missing: install Debian's faketime package");
    let (cache, seconds) = FAKETIME_CACHE.split_once('=').unwrap();
    [
        ("LD_PRELOAD", FAKETIME_LIB),
        ("FAKETIME_TIMESTAMP_FILE", file),
        (cache, seconds),
        // Shift only the wall clock: PostgreSQL's timers use the monotonic one.
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Writes `offset` to clock file `file`, then waits until the wall clock
/// is in a later second than when it was written (and 50 ms more): a
/// process of the server reads it at its next clock reading after that
/// (see [`FAKETIME_CACHE`]).
pub fn write_clock(file: &Path, offset: &str) {
    let second = || std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    std::fs::write(file, format!("{offset}\n")).unwrap();
    // Read after the write: a process that read the file in this second, before it, reads it again in the next.
    let written = second();
    // At most about a second: 30 naps of 50 ms.
    for _ in 0..30 {
        if second() > written {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(second() > written, "the wall clock did not move on within 1.5 s");
    std::thread::sleep(Duration::from_millis(50));
}

/// Waits (at most `secs`, polling every 100 ms) until `f` holds; fails the test naming `what` otherwise.
pub fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "not within {secs} s: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (at most 30 s) until the session of `application_name` on `server`
/// waits for a lock: the proof that it queued behind another, not a sleep.
pub fn eventually_waits_for_a_lock(server: &Server, application_name: &str) {
    let mut c = server.client();
    eventually(30, &format!("session {application_name} waits for a lock"), || {
        let n: i64 = c
            .query_one("SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND wait_event_type = 'Lock'", &[&application_name])
            .unwrap()
            .get(0);
        n == 1
    });
}

/// The SQLSTATE of a failed statement.
pub fn sqlstate(r: Result<impl Sized, postgres::Error>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.code().map(|c| c.code().to_string()).unwrap_or_else(|| format!("not a server error: {e}")),
    }
}

/// Decoded fields of a 64-bit ID: (ms since epoch, shard, seq).
pub fn decode(id: i64) -> (i64, i64, i64) {
    (id >> 23, (id >> 10) & 8191, id & 1023)
}
