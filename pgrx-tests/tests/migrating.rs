//! docs/migrating.md's recipe, run verbatim: a `bigserial` table of a
//! million rows switches to `next_shard_id(1)` with no collision and goes on
//! taking inserts; a table whose keys already reach the IDs the server mints
//! is refused, and left as it was.

use std::path::Path;

use pg_idgen_e2e::postgres::Client;
use pg_idgen_e2e::Server;

/// The SQL block of docs/migrating.md whose first line is `-- recipe: bigserial`.
fn recipe() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/migrating.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = text.find("```sql\n-- recipe: bigserial\n").expect("docs/migrating.md has a ```sql block headed -- recipe: bigserial");
    let body = &text[start + "```sql\n".len()..];
    body[..body.find("```").expect("the recipe's block ends")].to_string()
}

fn orders(c: &mut Client, rows: i64) {
    c.batch_execute(&format!(
        "CREATE TABLE public.orders (id bigserial PRIMARY KEY, note text);
         INSERT INTO public.orders (note) SELECT 'old' FROM generate_series(1, {rows});"
    ))
    .unwrap();
}

fn default_of(c: &mut Client) -> String {
    c.query_one("SELECT pg_get_expr(adbin, adrelid) FROM pg_attrdef WHERE adrelid = 'public.orders'::regclass", &[])
        .unwrap()
        .get(0)
}

#[test]
fn the_bigserial_recipe_switches_a_million_rows_and_refuses_a_table_that_would_collide() {
    let server = Server::start("migrating", &[]);
    let mut c = server.client();
    orders(&mut c, 1_000_000);
    let safe: bool = c
        .query_one("SELECT coalesce(max(id) < id_lower_bound(now()), true) FROM public.orders", &[])
        .unwrap()
        .get(0);
    assert!(safe, "the documented check calls a million bigserial keys unsafe");
    c.batch_execute(&recipe()).unwrap();
    assert_eq!(default_of(&mut c), "next_shard_id(1)");
    let sequences: i64 = c.query_one("SELECT count(*) FROM pg_class WHERE relname = 'orders_id_seq'", &[]).unwrap().get(0);
    assert_eq!(sequences, 0, "the old sequence is left");
    c.batch_execute("INSERT INTO public.orders (note) SELECT 'new' FROM generate_series(1, 100000)").unwrap();
    let row = c
        .query_one(
            "SELECT count(*), count(DISTINCT id),
                    (SELECT min(id) FROM public.orders WHERE note = 'new') > (SELECT max(id) FROM public.orders WHERE note = 'old'),
                    bool_and(id_shard(id) = 1) FILTER (WHERE note = 'new')
               FROM public.orders",
            &[],
        )
        .unwrap();
    assert_eq!((row.get::<_, i64>(0), row.get::<_, i64>(1)), (1_100_000, 1_100_000), "a key repeated");
    assert!(row.get::<_, bool>(2), "new keys not above the old ones");
    assert!(row.get::<_, bool>(3), "new keys not of shard 1");

    // A table whose keys already reach the IDs minted now (another 64-bit
    // generator's): the recipe refuses and changes nothing.
    c.batch_execute("CREATE DATABASE other").unwrap();
    let mut o = server.client_db("other");
    o.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    orders(&mut o, 1_000);
    o.batch_execute("INSERT INTO public.orders (id, note) VALUES (id_lower_bound(now() + interval '1 hour'), 'ahead')").unwrap();
    let e = o.batch_execute(&recipe()).unwrap_err();
    let db = e.as_db_error().unwrap_or_else(|| panic!("not a server error: {e}"));
    assert_eq!(db.code().code(), "P0001", "{db}");
    assert!(db.message().contains("cannot switch to pg_idgen IDs"), "{}", db.message());
    let _ = o.batch_execute("ROLLBACK");
    assert!(default_of(&mut o).starts_with("nextval("), "the refused recipe changed the default: {}", default_of(&mut o));
    let n: i64 = o.query_one("SELECT count(*) FROM public.orders", &[]).unwrap().get(0);
    assert_eq!(n, 1_001);
}

/// docs/faq.md's uninstall: `DROP EXTENSION` refuses (2BP01) while a
/// column default uses pg_idgen; the page's query lists the defaults to drop
/// (run here statement by statement, as psql's `\gexec` would), after which
/// the extension drops and the keys keep their values.
#[test]
fn the_faq_uninstall_drops_the_defaults_then_the_extension() {
    let server = Server::start("uninstall", &[]);
    let mut c = server.client();
    c.batch_execute(
        "CREATE TABLE a (id bigint PRIMARY KEY DEFAULT next_shard_id(1), n int);
         CREATE TABLE b (id uuid PRIMARY KEY DEFAULT uuid_v7(), n int);
         INSERT INTO a (n) VALUES (1); INSERT INTO b (n) VALUES (1);",
    )
    .unwrap();
    let e = c.batch_execute("DROP EXTENSION pg_idgen").unwrap_err();
    assert_eq!(e.code().map(|c| c.code()), Some("2BP01"), "{e:?}");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/faq.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let start = text.find("```sql\nSELECT format('ALTER TABLE %s ALTER COLUMN %I %s;'").expect("faq.md has the uninstall query");
    let block = &text[start + "```sql\n".len()..];
    let query = &block[..block.find("\\gexec").expect("the query ends with \\gexec")];
    let statements: Vec<String> = c.query(query, &[]).unwrap().iter().map(|r| r.get(0)).collect();
    assert_eq!(statements.len(), 2, "{statements:?}");
    for s in &statements {
        c.batch_execute(s).unwrap();
    }
    c.batch_execute("DROP EXTENSION pg_idgen").unwrap();
    let kept: i64 = c.query_one("SELECT (SELECT count(*) FROM a) + (SELECT count(*) FROM b)", &[]).unwrap().get(0);
    assert_eq!(kept, 2);
}
