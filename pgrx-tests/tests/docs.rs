//! The manual keeps up with the extension: every SQL function and every
//! `pg_idgen.*` setting of a running server appears in `docs/reference.md`,
//! and every relative link of `README.md` and `docs/*.md` names a file that
//! exists.

use std::path::{Path, PathBuf};

use pg_idgen_e2e::Server;

/// The repository's top directory (this crate lives in `pgrx-tests/`).
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The Markdown files of the manual: README.md and every `docs/*.md`.
fn manual_files() -> Vec<PathBuf> {
    let mut files = vec![repository().join("README.md")];
    let docs = repository().join("docs");
    let mut pages: Vec<PathBuf> = std::fs::read_dir(&docs)
        .unwrap_or_else(|e| panic!("{}: {e}", docs.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    assert!(!pages.is_empty(), "no Markdown page in {}", docs.display());
    files.extend(pages);
    files
}

/// The targets of the inline links `[text](target)` of a Markdown text,
/// outside code blocks and code spans.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        // Drop code spans, whose brackets are not links.
        let mut plain = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                plain.push(c);
            }
        }
        let mut rest = plain.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = after[..end].trim();
            // `[text](target "title")`: the target is the first word.
            let target = target.split_whitespace().next().unwrap_or("");
            targets.push(target.to_string());
            rest = &after[end + 1..];
        }
    }
    targets
}

#[test]
fn every_function_and_setting_is_in_the_reference() {
    let reference_path = repository().join("docs").join("reference.md");
    let reference = read(&reference_path);

    let server = Server::start("docs", &[]);
    let mut c = server.client();
    let functions: Vec<(String, String)> = c
        .query(
            "SELECT p.proname::text, pg_catalog.pg_get_function_identity_arguments(p.oid)
               FROM pg_catalog.pg_depend d
               JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
               JOIN pg_catalog.pg_proc p ON p.oid = d.objid
              WHERE d.classid = 'pg_catalog.pg_proc'::regclass
                AND d.refclassid = 'pg_catalog.pg_extension'::regclass
                AND d.deptype = 'e'
                AND e.extname = 'pg_idgen'
              ORDER BY 1, 2",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let settings: Vec<String> = c
        // pg_settings leaves out the public-ID key (its reset value would show
        // it); the setting exists where current_setting() finds it.
        .query(
            "SELECT name FROM pg_catalog.pg_settings WHERE name LIKE 'pg_idgen.%'
             UNION SELECT 'pg_idgen.public_id_key' WHERE current_setting('pg_idgen.public_id_key', true) IS NOT NULL
             ORDER BY 1",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    // The queries found what the extension has, not nothing.
    assert!(functions.len() >= 40, "only {} functions of pg_idgen: {functions:?}", functions.len());
    for name in ["next_shard_id", "uuid_v7", "id_generator_server_status", "shard_claim"] {
        assert!(functions.iter().any(|(f, _)| f == name), "{name} is not among {functions:?}");
    }
    assert!(settings.len() >= 6, "only {} pg_idgen settings: {settings:?}", settings.len());
    for name in ["pg_idgen.epoch", "pg_idgen.max_clock_lead_ms", "pg_idgen.public_id_key"] {
        assert!(settings.iter().any(|s| s == name), "{name} is not among {settings:?}");
    }

    // A name counts as present in backticks, alone or called: `name` or `name(...`.
    let mentioned = |name: &str| reference.contains(&format!("`{name}`")) || reference.contains(&format!("`{name}("));
    let mut missing: Vec<String> = Vec::new();
    for (name, args) in &functions {
        if !mentioned(name) {
            missing.push(format!("function {name}({args})"));
        }
    }
    for name in &settings {
        if !mentioned(name) {
            missing.push(format!("setting {name}"));
        }
    }
    missing.dedup();
    assert!(
        missing.is_empty(),
        "{} of {} functions and {} settings are missing from {}:\n{}",
        missing.len(),
        functions.len(),
        settings.len(),
        reference_path.display(),
        missing.join("\n")
    );
}

/// The cells of a Markdown table row (`| a | b |`), trimmed; None for other lines.
fn cells(line: &str) -> Option<Vec<String>> {
    let inner = line.trim().strip_prefix('|')?.strip_suffix('|')?;
    Some(inner.split('|').map(|c| c.trim().to_string()).collect())
}

/// The text of the first code span of a cell.
fn code(cell: &str) -> Option<&str> {
    let rest = &cell[cell.find('`')? + 1..];
    Some(&rest[..rest.find('`')?])
}

/// Type names as the reference writes them.
fn short_types(sig: &str) -> String {
    [("timestamp with time zone", "timestamptz"), ("integer", "int"), ("double precision", "float8")]
        .iter()
        .fold(sig.to_string(), |s, (long, short)| s.replace(long, short))
}

/// A signature without its OUT arguments (the reference lists those as the result).
fn in_args(sig: &str) -> String {
    let Some((name, args)) = sig.strip_suffix(')').and_then(|s| s.split_once('(')) else { return sig.to_string() };
    let kept: Vec<&str> = args.split(", ").filter(|a| !a.starts_with("OUT ")).collect();
    format!("{name}({})", kept.join(", "))
}

/// What the reference states of each function (volatility, parallel
/// safety, strictness where it says), of each setting (default and
/// context), and which SQLSTATEs it explains, against a running server and
/// the code.
#[test]
fn the_reference_states_each_functions_flags_and_each_settings_default_as_the_server_has_them() {
    let reference = read(&repository().join("docs").join("reference.md"));
    let server = Server::start("docs-values", &[]);
    let mut c = server.client();
    let mut wrong: Vec<String> = Vec::new();

    // Functions: `| `name(args)` | returns | FLAGS | ... |`.
    let rows = c
        .query(
            "SELECT p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')',
                    CASE p.provolatile WHEN 'i' THEN 'IMMUTABLE' WHEN 's' THEN 'STABLE' ELSE 'VOLATILE' END,
                    CASE p.proparallel WHEN 's' THEN 'PARALLEL SAFE' WHEN 'r' THEN 'PARALLEL RESTRICTED' ELSE 'PARALLEL UNSAFE' END,
                    p.proisstrict
               FROM pg_catalog.pg_depend d
               JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid
               JOIN pg_catalog.pg_proc p ON p.oid = d.objid
              WHERE d.classid = 'pg_catalog.pg_proc'::regclass AND d.deptype = 'e' AND e.extname = 'pg_idgen'",
            &[],
        )
        .unwrap();
    let mut checked = 0;
    for row in &rows {
        let (sig, volatility, parallel, strict): (String, String, String, bool) = (row.get(0), row.get(1), row.get(2), row.get(3));
        let sig = in_args(&short_types(&sig));
        for cols in reference.lines().filter_map(cells) {
            if cols.len() < 3 || code(&cols[0]).map(short_types) != Some(sig.clone()) {
                continue;
            }
            let flags = &cols[2];
            if !["IMMUTABLE", "STABLE", "VOLATILE"].iter().any(|v| flags.contains(v)) {
                continue; // a table without a flags column
            }
            checked += 1;
            if !flags.contains(&volatility) || !flags.contains(&parallel) {
                wrong.push(format!("{sig}: the reference says {flags}; the server has {volatility}, {parallel}"));
            }
            if flags.contains("not STRICT") && strict || (flags.contains("STRICT") && !flags.contains("not STRICT") && !strict) {
                wrong.push(format!("{sig}: the reference says {flags}; the server has strict = {strict}"));
            }
        }
    }
    // Every row with flags named a function the server has, as it has it.
    let server_sigs: Vec<String> = rows.iter().map(|r| in_args(&short_types(&r.get::<_, String>(0)))).collect();
    for cols in reference.lines().filter_map(cells) {
        if cols.len() >= 3 && ["IMMUTABLE", "STABLE", "VOLATILE"].iter().any(|v| cols[2].contains(v)) {
            if let Some(sig) = code(&cols[0]) {
                if !server_sigs.contains(&short_types(sig)) {
                    wrong.push(format!("{sig}: in the reference, not a function of the server (its signature differs?)"));
                }
            }
        }
    }
    assert!(checked >= 25, "only {checked} function rows of the reference were checked: the probe did not find them");

    // Settings: `| `pg_idgen.x` | default | context | ... |`.
    let settings = c
        .query("SELECT name, coalesce(boot_val, ''), coalesce(unit, ''), context FROM pg_catalog.pg_settings WHERE name LIKE 'pg_idgen.%'", &[])
        .unwrap();
    let mut checked = 0;
    for row in &settings {
        let (name, boot, unit, context): (String, String, String, String) = (row.get(0), row.get(1), row.get(2), row.get(3));
        let Some(cols) = reference.lines().filter_map(cells).find(|c| c.len() >= 3 && code(&c[0]) == Some(name.as_str())) else {
            continue; // named elsewhere in the reference (the test above checks that)
        };
        checked += 1;
        let (default, doc_context) = (&cols[1], &cols[2]);
        let default_ok = match boot.as_str() {
            "" => default == "unset" || default == "empty",
            _ => code(default) == Some(boot.as_str()) || default.contains(&format!("{boot}{unit}")) || default.contains(&format!("{boot} {unit}")),
        };
        if !default_ok {
            wrong.push(format!("{name}: the reference's default is {default}; the server's is {boot}{unit}"));
        }
        let words: &[&str] = match context.as_str() {
            "sighup" => &["sighup", "reload"],
            "superuser-backend" => &["superuser, at connection start"],
            other => &[other],
        };
        if !words.iter().any(|w| doc_context.starts_with(w)) {
            wrong.push(format!("{name}: the reference's context is {doc_context}; the server's is {context}"));
        }
    }
    assert!(checked >= 10, "only {checked} settings rows were checked");

    // SQLSTATEs: each condition the code raises has its section.
    let mut sources = Vec::new();
    let mut dirs = vec![repository().join("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(read(&path));
            }
        }
    }
    let mut conditions: Vec<String> = sources
        .iter()
        .flat_map(|s| s.split("ERRCODE_").skip(1).map(|rest| rest.chars().take_while(|c| c.is_ascii_uppercase() || *c == '_').collect::<String>()))
        .filter(|c| !c.is_empty())
        // PostgreSQL's macro names prefix a few conditions with their class (E_R_I_E_: 39xxx).
        .map(|c| c.trim_start_matches("E_R_I_E_").to_lowercase())
        .collect();
    conditions.sort();
    conditions.dedup();
    assert!(conditions.len() >= 10, "only {} conditions found in src/", conditions.len());
    for condition in conditions {
        if !reference.contains(&condition) {
            wrong.push(format!("SQLSTATE {condition}: raised in src/, not explained in the reference"));
        }
    }
    // README names this release's version (the packages' file names carry it).
    let cargo = read(&repository().join("Cargo.toml"));
    let version = cargo.lines().find_map(|l| l.strip_prefix("version = \"")).and_then(|v| v.strip_suffix('"')).expect("Cargo.toml's version");
    let readme = read(&repository().join("README.md"));
    if !readme.contains(&format!("the current one is {version}.")) {
        wrong.push(format!("README.md does not name the current release {version} beside the package names"));
    }
    assert!(wrong.is_empty(), "docs/reference.md disagrees with the server or the code:\n{}", wrong.join("\n"));
}

#[test]
fn every_relative_link_of_the_manual_names_a_file_that_exists() {
    let mut checked = 0;
    let mut broken: Vec<String> = Vec::new();
    for file in manual_files() {
        let text = read(&file);
        let dir = file.parent().unwrap();
        for target in link_targets(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            if target.starts_with('#') {
                continue;
            }
            let path = target.split('#').next().unwrap();
            if path.is_empty() {
                broken.push(format!("{}: empty link target ({target:?})", file.display()));
                continue;
            }
            checked += 1;
            if !dir.join(path).exists() {
                broken.push(format!("{}: {target} ({} does not exist)", file.display(), dir.join(path).display()));
            }
        }
    }
    assert!(checked >= 20, "only {checked} relative links found in README.md and docs/*.md");
    assert!(broken.is_empty(), "{} broken relative links:\n{}", broken.len(), broken.join("\n"));
}

#[test]
fn link_targets_are_parsed_as_written() {
    let text = "See [a](docs/a.md), [b](b.md#part \"title\") and [web](https://x.org).\n\
                `[not](a-link.md)` and\n```\n[nor](this.md)\n```\n[anchor](#here)";
    assert_eq!(link_targets(text), ["docs/a.md", "b.md#part", "https://x.org", "#here"]);
}
