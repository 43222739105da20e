//! The 64-bit IDs in SQL: minting (here, or where Citus routes it), decoding, building and range bounds.

use pgrx::prelude::*;

use crate::core::layout::{self, Parts, Placed, Shard};
use crate::errors::OrRaise;
use crate::clock::timestamptz;
use crate::citus::{self, Call, Routed};
use crate::epoch;
use crate::minting::mint;

fn ms_of(ts: TimestampWithTimeZone) -> i64 {
    layout::ms_of_timestamptz(ts.into(), epoch::for_decoding()).or_raise()
}

fn parts_of(id: i64) -> Parts {
    layout::decompose(id).or_raise()
}

/// The next ID for a logical shard (0..8191).
#[pg_extern(volatile, parallel_unsafe, strict)]
fn next_shard_id(shard: i32) -> i64 {
    let shard = Shard::new(shard).or_raise();
    match citus::route(Call::Shard(shard), "next_shard_id") {
        Some(Routed::Minted(id)) => id,
        Some(Routed::Here(s)) => mint(s, "next_shard_id"),
        None => mint(shard, "next_shard_id"),
    }
}

/// The next ID of this Citus node group's own logical shard, minted on the
/// node the statement runs on, with no call to another node: the key for
/// hash-distributed tables.
#[pg_extern(volatile, parallel_unsafe)]
fn next_node_id() -> i64 {
    match citus::route(Call::Node, "next_node_id") {
        Some(Routed::Minted(id)) => id,
        Some(Routed::Here(s)) => mint(s, "next_node_id"),
        None => crate::errors::IdError::CitusNotANode("next_node_id").raise(),
    }
}

/// The time an ID was minted (to the millisecond).
#[pg_extern(immutable, parallel_safe, strict)]
fn id_ts(id: i64) -> TimestampWithTimeZone {
    timestamptz(layout::timestamptz_of_ms(parts_of(id).ms, epoch::for_decoding()))
}

/// The logical shard of an ID.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_shard(id: i64) -> i32 {
    parts_of(id).shard
}

/// The sequence number of an ID within its millisecond and shard.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_seq(id: i64) -> i32 {
    parts_of(id).seq
}

/// Builds the ID carrying a time (rounded down to the millisecond), shard and sequence number.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_from_parts(ts: TimestampWithTimeZone, shard: i32, seq: i32) -> i64 {
    layout::compose(Parts { ms: ms_of(ts), shard, seq }).or_raise()
}

/// The smallest ID that can carry the millisecond of `ts`.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_lower_bound(ts: TimestampWithTimeZone) -> i64 {
    layout::lower_bound(ms_of(ts)).or_raise()
}

/// The largest ID that can carry the millisecond of `ts`.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_upper_bound(ts: TimestampWithTimeZone) -> i64 {
    layout::upper_bound(ms_of(ts)).or_raise()
}

/// How far apart IDs lie whose times are `span` apart: the width of range
/// partitions that each hold one stretch of time (pg_partman's
/// `p_interval`, its retention), bounded at multiples of it.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_interval(span: Interval) -> i64 {
    layout::interval_span(span.months(), span.days(), span.micros()).or_raise()
}

/// `id_lower_bound` for any time: 0 before the epoch, the largest ID past the range.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_lower_bound_clamped(ts: TimestampWithTimeZone) -> i64 {
    match layout::place_timestamptz(ts.into(), epoch::for_decoding()) {
        Placed::Before => 0,
        Placed::Within(ms) => layout::lower_bound(ms).or_raise(),
        Placed::After => i64::MAX,
    }
}

/// `id_upper_bound` for any time: -1 (below every ID) before the epoch, the largest ID past the range.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_upper_bound_clamped(ts: TimestampWithTimeZone) -> i64 {
    match layout::place_timestamptz(ts.into(), epoch::for_decoding()) {
        Placed::Before => -1,
        Placed::Within(ms) => layout::upper_bound(ms).or_raise(),
        Placed::After => i64::MAX,
    }
}


extension_sql!(
    r#"
CREATE FUNCTION id_decode(id bigint, OUT ts timestamptz, OUT shard int, OUT seq int)
RETURNS record
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT @extschema@.id_ts(id), @extschema@.id_shard(id), @extschema@.id_seq(id) $$;
COMMENT ON FUNCTION id_decode(bigint) IS 'The time, logical shard and sequence number of an ID.';
"#,
    name = "id_decode",
    requires = [id_ts, id_shard, id_seq]
);

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{explain, one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn next_shard_id_carries_its_shard_and_the_time() {
        // Another test of this server may have raised every generator ahead
        // of the clock (an adopt, a restored mark): wait until shard 77's is
        // not, so that its next ID carries the clock's time (at most 15 s).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
        while one::<bool>("SELECT coalesce((SELECT lead_ms > 0 FROM id_generator_status() WHERE shard = 77), false)")
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let (shard, ok): (i32, bool) = {
            let r = Spi::get_two::<i32, bool>(
                "WITH x AS (SELECT clock_timestamp() AS before, next_shard_id(77) AS id, clock_timestamp() AS after)
                 SELECT id_shard(id), id_ts(id) BETWEEN date_trunc('milliseconds', before) AND after FROM x",
            )
            .unwrap();
            (r.0.unwrap(), r.1.unwrap())
        };
        assert_eq!(shard, 77);
        assert!(ok, "decoded time is not the minting time");
    }

    #[pg_test]
    fn next_node_id_outside_a_citus_cluster_is_refused() {
        assert_eq!(
            crate::testing::error_of("next_node_id()"),
            "55000: next_node_id must run on a node of a Citus cluster / This database has no citus extension."
        );
    }

    #[pg_test]
    fn ids_of_one_shard_strictly_increase_within_a_statement() {
        let bad: i64 = one(
            "SELECT count(*) FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev
               FROM (SELECT n, next_shard_id(5) AS id FROM generate_series(1, 200000) n) s) t
             WHERE id <= prev",
        );
        assert_eq!(bad, 0);
        let distinct: i64 = one("SELECT count(DISTINCT next_shard_id(6)) FROM generate_series(1, 100000)");
        assert_eq!(distinct, 100000);
    }

    #[pg_test]
    fn a_full_millisecond_moves_on_and_never_wraps() {
        // 5000 IDs in one shard need at least 5 milliseconds of sequence
        // space: all distinct (a wrap within a millisecond would repeat one),
        // in order of minting (a wrap would go back), over at least 5 ms.
        let row: String = one(
            "SELECT count(DISTINCT id) || ' ' || bool_and(id > prev OR prev IS NULL) || ' ' || (count(DISTINCT id_ts(id)) >= 5)
               FROM (SELECT id, lag(id) OVER (ORDER BY n) AS prev
                       FROM (SELECT n, next_shard_id(9) AS id FROM generate_series(1, 5000) n) s) t",
        );
        assert_eq!(row, "5000 true true");
    }

    #[pg_test]
    fn next_shard_id_is_strict_and_checks_the_range() {
        assert_eq!(Spi::get_one::<i64>("SELECT next_shard_id(NULL)").unwrap(), None);
        assert_eq!(sqlstate("next_shard_id(8192)"), "22003");
        assert_eq!(sqlstate("next_shard_id(-1)"), "22003");
        assert_eq!(one::<i64>("SELECT id_shard(next_shard_id(8191))::bigint"), 8191);
        assert_eq!(one::<i64>("SELECT id_shard(next_shard_id(0))::bigint"), 0);
    }

    #[pg_test(error = "shard 8192 is out of range 0 to 8191")]
    fn shard_range_is_in_the_message() {
        Spi::run("SELECT next_shard_id(8192)").unwrap();
    }

    #[pg_test]
    fn decode_gives_exact_values() {
        // 2026-01-01 00:00:01.234+00 is 1234 ms after the default epoch.
        let id: i64 = one("SELECT id_from_parts('2026-01-01 00:00:01.234567+00', 300, 17)");
        assert_eq!(id, (1234 << 23) | (300 << 10) | 17);
        assert_eq!(one::<String>(&format!("SELECT id_decode({id})::text")), "(\"2026-01-01 00:00:01.234+00\",300,17)");
        assert_eq!(one::<String>(&format!("SELECT (id_decode({id})).ts::text")), "2026-01-01 00:00:01.234+00");
        assert_eq!(one::<i32>(&format!("SELECT id_shard({id})")), 300);
        assert_eq!(one::<i32>(&format!("SELECT id_seq({id})")), 17);
        assert_eq!(one::<String>("SELECT id_epoch()::text"), "2026-01-01 00:00:00+00");
        assert_eq!(one::<String>("SELECT id_ts(0)::text"), "2026-01-01 00:00:00+00");
        assert_eq!(one::<String>("SELECT id_decode(9223372036854775807)::text"), "(\"2060-11-03 19:53:47.775+00\",8191,1023)");
    }

    #[pg_test]
    fn decode_stays_unambiguous_beside_pg_hashids() {
        // pg_hashids defines id_decode(text); a stand-in with its signature.
        Spi::run("CREATE FUNCTION id_decode(text) RETURNS bigint[] LANGUAGE sql AS 'SELECT ARRAY[-1::bigint]'").unwrap();
        assert_eq!(one::<String>("SELECT id_decode(1026)::text"), "(\"2026-01-01 00:00:00+00\",1,2)");
        assert_eq!(one::<String>("SELECT id_decode(1026::bigint)::text"), "(\"2026-01-01 00:00:00+00\",1,2)");
        // An untyped string literal goes to the text function, as PostgreSQL prefers text for unknowns.
        assert_eq!(one::<String>("SELECT id_decode('1026')::text"), "{-1}");
    }

    #[pg_test]
    fn decode_rejects_negative_ids() {
        for f in ["id_ts", "id_shard", "id_seq", "id_decode"] {
            assert_eq!(sqlstate(&format!("{f}(-1)")), "22003", "{f}");
        }
    }

    #[pg_test]
    fn from_parts_rejects_out_of_range_parts() {
        assert_eq!(sqlstate("id_from_parts(now(), 8192, 0)"), "22003");
        assert_eq!(sqlstate("id_from_parts(now(), -1, 0)"), "22003");
        assert_eq!(sqlstate("id_from_parts(now(), 0, 1024)"), "22003");
        assert_eq!(sqlstate("id_from_parts(now(), 0, -1)"), "22003");
        assert_eq!(sqlstate("id_from_parts('2025-12-31 23:59:59.999+00', 0, 0)"), "22008");
        assert_eq!(sqlstate("id_from_parts('2060-11-03 19:53:47.776+00', 0, 0)"), "22008");
        assert_eq!(sqlstate("id_from_parts('infinity', 0, 0)"), "22008");
        assert_eq!(sqlstate("id_lower_bound('-infinity')"), "22008");
        assert_eq!(one::<i64>("SELECT id_from_parts('2060-11-03 19:53:47.775+00', 8191, 1023)"), i64::MAX);
    }

    #[pg_test]
    fn bounds_enclose_their_millisecond() {
        let (lo, hi): (i64, i64) = {
            let r = Spi::get_two::<i64, i64>(
                "SELECT id_lower_bound('2026-03-04 05:06:07.089+00'), id_upper_bound('2026-03-04 05:06:07.0891+00')",
            )
            .unwrap();
            (r.0.unwrap(), r.1.unwrap())
        };
        assert_eq!(hi - lo, (1 << 23) - 1);
        assert_eq!(one::<i64>("SELECT id_from_parts('2026-03-04 05:06:07.089+00', 0, 0)"), lo);
        assert_eq!(one::<i64>("SELECT id_from_parts('2026-03-04 05:06:07.089+00', 8191, 1023)"), hi);
        assert_eq!(one::<i64>("SELECT id_upper_bound('2026-03-04 05:06:07.088+00') + 1"), lo);
    }

    #[pg_test]
    fn a_time_range_becomes_a_primary_key_range() {
        Spi::run(
            "CREATE TABLE ev (id bigint PRIMARY KEY DEFAULT next_shard_id(1), n int);
             INSERT INTO ev (n) SELECT g FROM generate_series(1, 3000) g;
             ANALYZE ev;",
        )
        .unwrap();
        let in_range: i64 = one(
            "SELECT count(*) FROM ev WHERE id BETWEEN id_lower_bound(now() - interval '1 hour')
                                              AND id_upper_bound(clock_timestamp())",
        );
        assert_eq!(in_range, 3000);
        Spi::run("SET enable_seqscan = off").unwrap();
        let explained = explain("SELECT * FROM ev WHERE id BETWEEN id_lower_bound(now()) AND id_upper_bound(now())");
        assert!(explained.contains("Index Cond: ((id >= "), "{explained}");
    }

    #[pg_test]
    fn functions_declare_volatility_and_parallel_safety() {
        let rows: String = one(
            "SELECT string_agg(proname || ':' || provolatile::text || proparallel::text || proisstrict::text, ' ' ORDER BY proname)
               FROM pg_proc WHERE proname IN ('next_shard_id','id_ts','id_shard','id_seq','id_decode',
                 'id_from_parts','id_lower_bound','id_upper_bound','id_lower_bound_clamped','id_upper_bound_clamped','id_epoch')
                 AND 'text'::regtype <> ALL (proargtypes)",
        );
        assert_eq!(
            rows,
            "id_decode:istrue id_epoch:sstrue id_from_parts:istrue id_lower_bound:istrue id_lower_bound_clamped:istrue \
             id_seq:istrue id_shard:istrue id_ts:istrue id_upper_bound:istrue id_upper_bound_clamped:istrue next_shard_id:vutrue"
        );
    }

    #[pg_test]
    fn lead_bound_is_one_server_wide_setting_in_milliseconds() {
        assert_eq!(one::<String>("SELECT context FROM pg_settings WHERE name = 'pg_idgen.max_clock_lead_ms'"), "sighup");
        assert_eq!(one::<String>("SELECT unit FROM pg_settings WHERE name = 'pg_idgen.max_clock_lead_ms'"), "ms");
        // Not per session, nor per role or database: a stricter bound of one
        // role would make it refuse what others' minting put ahead.
        assert_eq!(sqlstate("set_config('pg_idgen.max_clock_lead_ms', '100', false)"), "55P02");
        assert_eq!(sqlstate("set_config('pg_idgen.max_clock_lead_ms', '1d', true)"), "55P02");
        assert_eq!(one::<String>("SELECT context FROM pg_settings WHERE name = 'pg_idgen.epoch'"), "postmaster");
    }
}
