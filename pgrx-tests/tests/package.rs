//! The package this run installed (`scripts/test` builds it with
//! `scripts/package` and names it in `PG_IDGEN_PACKAGE`) is what the other
//! end-to-end tests run against: its files are the installed ones, byte for
//! byte, laid out where PostgreSQL looks, with the metadata a package needs.

use std::path::{Path, PathBuf};
use std::process::Command;

use pg_idgen_e2e::{pg_config, unpack_package};

fn package() -> PathBuf {
    let p = std::env::var("PG_IDGEN_PACKAGE")
        .expect("PG_IDGEN_PACKAGE names the package under test: run the suite with scripts/test");
    PathBuf::from(p)
}

fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(out.status.success(), "{program} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn version() -> String {
    let cargo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")).unwrap();
    cargo.lines().find_map(|l| l.strip_prefix("version = \"")).unwrap().trim_end_matches('"').to_string()
}

#[test]
fn the_installed_files_are_the_packages() {
    let pkg = package();
    let dir = std::env::temp_dir().join(format!("pg_idgen_pkg_check-{}", std::process::id()));
    let top = unpack_package(&pkg, &dir);
    if pkg.extension().is_none_or(|e| e != "deb") {
        assert!(top.join("install.sh").exists(), "the tarball has install.sh");
        for doc in ["README.md", "CHANGELOG.md", "docs/reference.md"] {
            assert!(top.join(doc).exists(), "the tarball has {doc}");
        }
    }
    let (lib, ext) = (top.join("lib").canonicalize().unwrap(), top.join("extension").canonicalize().unwrap());
    let v = version();
    // Update scripts: pg_idgen--FROM--TO.sql (two "--").
    let is_update = |p: &std::path::Path| p.file_name().unwrap().to_string_lossy().matches("--").count() == 2;
    let mut files = vec![lib.join("pg_idgen.so"), ext.join("pg_idgen.control"), ext.join(format!("pg_idgen--{v}.sql"))];
    files.extend(std::fs::read_dir(&ext).unwrap().map(|e| e.unwrap().path()).filter(|p| is_update(p)));
    let installed_lib = pg_config("--pkglibdir");
    let installed_ext = pg_config("--sharedir").join("extension");
    for f in &files {
        let name = f.file_name().unwrap();
        let installed = if f.starts_with(&lib) { installed_lib.join(name) } else { installed_ext.join(name) };
        assert_eq!(std::fs::read(f).unwrap(), std::fs::read(&installed).unwrap(), "{} is not what is installed", name.to_string_lossy());
    }
    // Every update script of the source tree is in the package, and no other.
    let names = |paths: Vec<std::path::PathBuf>| {
        let mut n: Vec<String> =
            paths.into_iter().filter(|p| is_update(p)).map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        n.sort();
        n
    };
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../sql");
    let expected = names(std::fs::read_dir(source).unwrap().map(|e| e.unwrap().path()).collect());
    assert!(expected.len() >= 4, "update scripts from 0.1.0 on: {expected:?}");
    assert_eq!(names(files.clone()), expected, "the package's update scripts");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_debian_package_says_what_it_is() {
    let pkg = package();
    // scripts/test reports this test as skipped where the package is a tarball (16, 17, 18).
    assert!(pkg.extension().is_some_and(|e| e == "deb"), "not a Debian package: {}", pkg.display());
    let p = pkg.to_str().unwrap();
    let field = |f: &str| run("dpkg-deb", &["-f", p, f]).trim().to_string();
    assert_eq!(field("Package"), "postgresql-15-pg-idgen");
    assert_eq!(field("Version"), version());
    assert_eq!(field("Architecture"), "amd64");
    assert!(field("Depends").starts_with("postgresql-15"), "{}", field("Depends"));
    assert_eq!(pkg.file_name().unwrap().to_string_lossy(), format!("postgresql-15-pg-idgen_{}_amd64.deb", version()));
    let contents = run("dpkg-deb", &["-c", p]);
    for path in [
        "./usr/lib/postgresql/15/lib/pg_idgen.so",
        "./usr/share/postgresql/15/extension/pg_idgen.control",
        "./usr/share/doc/postgresql-15-pg-idgen/changelog.Debian.gz",
        "./usr/share/doc/postgresql-15-pg-idgen/copyright",
        "./usr/share/doc/postgresql-15-pg-idgen/README.md",
        "./usr/share/doc/postgresql-15-pg-idgen/CHANGELOG.md",
        "./usr/share/doc/postgresql-15-pg-idgen/docs/reference.md",
    ] {
        assert!(contents.contains(path), "{path} missing from\n{contents}");
    }
    assert!(contents.lines().all(|l| l.contains("root/root")), "files owned by root:\n{contents}");
}

#[test]
fn the_pgxn_metadata_names_this_version() {
    let meta = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../META.json")).unwrap();
    let v = version();
    assert_eq!(meta.matches(&format!("\"version\": \"{v}\"")).count(), 2, "META.json's release and extension versions are {v}");
    let control = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../pg_idgen.control")).unwrap();
    assert!(control.contains("default_version = '@CARGO_VERSION@'"), "the control file follows Cargo.toml");
}

/// The tarball of this major (named by `PG_IDGEN_TARBALL`; on 15 it is
/// built beside the Debian package the rest of the suite runs against),
/// installed by its install.sh, without cargo, into a private copy of the
/// installation: its files land there, and a server preloading them mints,
/// decodes and makes UUIDs.
#[test]
fn the_tarball_installs_with_its_script_and_mints() {
    let tarball = PathBuf::from(
        std::env::var("PG_IDGEN_TARBALL").ok().filter(|v| !v.is_empty()).expect("PG_IDGEN_TARBALL names the tarball: run the suite with scripts/test"),
    );
    let installation = pg_idgen_e2e::Installation::copy("tarball");
    for dir in [&installation.pkglibdir, &installation.extensiondir] {
        for f in std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()) {
            if f.file_name().unwrap().to_string_lossy().starts_with("pg_idgen") {
                std::fs::remove_file(f).unwrap();
            }
        }
    }
    let dir = std::env::temp_dir().join(format!("pg_idgen_tarball_check-{}", std::process::id()));
    let top = unpack_package(&tarball, &dir);
    // A pg_config of another major is refused, before anything is written.
    let other = dir.join("other-major");
    std::fs::create_dir_all(&other).unwrap();
    let fake = other.join("pg_config");
    std::fs::write(&fake, format!("#!/bin/sh\ncase \"$1\" in --version) echo 'PostgreSQL 99.1';; *) echo {};; esac\n", other.display())).unwrap();
    run("chmod", &["0755", fake.to_str().unwrap()]);
    let refused = std::process::Command::new("sh").arg(top.join("install.sh")).arg(&fake).output().unwrap();
    assert!(!refused.status.success(), "install.sh accepted a pg_config of PostgreSQL 99");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("PostgreSQL 99"), "{}", String::from_utf8_lossy(&refused.stderr));
    assert_eq!(std::fs::read_dir(&other).unwrap().count(), 1, "install.sh wrote files for another major");
    let pg_config = installation.bindir.join("pg_config");
    let out = run("sh", &[top.join("install.sh").to_str().unwrap(), pg_config.to_str().unwrap()]);
    assert!(out.contains("installed ") && out.contains("pg_idgen.so"), "{out}");
    assert_eq!(
        std::fs::read(top.join("lib/pg_idgen.so")).unwrap(),
        std::fs::read(installation.pkglibdir.join("pg_idgen.so")).unwrap()
    );
    let server = pg_idgen_e2e::Server::init_in(&installation.bindir, "tarball", &["shared_preload_libraries = 'pg_idgen'"]);
    let mut c = server.client();
    c.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    let row = c
        .query_one("SELECT extversion, id_shard(next_shard_id(42)), uuid_v7_ts(uuid_v7()) IS NOT NULL FROM pg_extension WHERE extname = 'pg_idgen'", &[])
        .unwrap();
    assert_eq!((row.get::<_, String>(0), row.get::<_, i32>(1), row.get::<_, bool>(2)), (version(), 42, true));
    let _ = std::fs::remove_dir_all(&dir);
}
