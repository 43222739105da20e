//! Without `shared_preload_libraries`, decoding works and minting is refused cleanly.

use pg_idgen_e2e::{sqlstate, Server};

#[test]
fn without_preload_minting_is_55000_and_decoding_works() {
    let server = Server::init("no_preload", &[]);
    let mut c = server.client();
    c.batch_execute("CREATE EXTENSION pg_idgen").unwrap();
    for sql in ["SELECT next_shard_id(1)", "SELECT next_schema_id('public')"] {
        let err = c.query_one(sql, &[]).unwrap_err();
        let db = err.as_db_error().expect("a server error");
        assert_eq!(db.code().code(), "55000", "{sql}: {db}");
        assert!(db.hint().unwrap_or("").contains("shared_preload_libraries"), "{sql}: {:?}", db.hint());
    }
    let row = c
        .query_one("SELECT (id_decode((1251::bigint << 23) | (1 << 10) | 2)).shard, id_seq(1026), id_ts(0)::text", &[])
        .unwrap();
    assert_eq!(row.get::<_, i32>(0), 1);
    assert_eq!(row.get::<_, i32>(1), 2);
    assert_eq!(row.get::<_, String>(2), "2026-01-01 00:00:00+00");
    // The session still works after the errors.
    assert_eq!(sqlstate(c.query_one("SELECT id_shard(-1)", &[])), "22003");
    drop(c);
    assert!(!server.log().contains("PANIC"), "{}", server.log());
}

#[test]
fn an_invalid_epoch_stops_the_server_from_starting() {
    let result = std::panic::catch_unwind(|| {
        Server::init("bad_epoch", &["shared_preload_libraries = 'pg_idgen'", "pg_idgen.epoch = 'soon'"])
    });
    let panic = result.err().expect("a server started with pg_idgen.epoch = 'soon'");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("invalid value for parameter \"pg_idgen.epoch\": \"soon\""), "{message}");
}
