//! Foreign ID schemes in SQL: 64-bit layouts by name (Instagram, Twitter,
//! Discord, Sonyflake and our own), ULIDs stored as `uuid`, KSUID and
//! ObjectID times. The arithmetic is `core::schemes`; this is the glue.

use pgrx::prelude::*;

use crate::core::layout;
use crate::core::schemes::{self, Decoded, Layout, SchemeError};
use crate::errors::{IdError, OrRaise};
use crate::epoch;

/// The layout of a name: ours with this database's epoch, or a foreign one.
fn layout_of(name: &str) -> Layout {
    if name == Layout::PG_IDGEN_NAME {
        return Layout::pg_idgen(epoch::for_decoding());
    }
    Layout::by_name(name).ok_or_else(|| IdError::UnknownLayout(name.into())).or_raise()
}

/// Maps a core error of a text function, naming the input; an overflowing
/// value is malformed text too.
fn text_error<'a>(kind: &'static str, input: &'a str) -> impl Fn(SchemeError) -> IdError + 'a {
    move |e| match e {
        SchemeError::TimeOutOfRange => IdError::TimeOutOfRangeFor { what: format!("a {kind}"), range: None },
        _ => IdError::InvalidText { kind, input: input.into() },
    }
}

/// A time a layout's IDs cannot carry, with the layout's own range.
fn out_of_range(layout: &Layout) -> IdError {
    IdError::TimeOutOfRangeFor {
        what: format!("an ID of layout \"{}\"", layout.name()),
        range: layout.last_carried_unix_ms().ok().map(|last| (layout.epoch_ms(), last)),
    }
}

fn value_error(layout: &Layout) -> impl Fn(SchemeError) -> IdError + '_ {
    move |e| match e {
        SchemeError::NegativeId => IdError::NegativeLayoutId,
        SchemeError::TimeOutOfRange | SchemeError::ValueOutOfRange | SchemeError::InvalidText { .. } => out_of_range(layout),
    }
}

fn timestamptz_of_unix_ms(ms: i64) -> TimestampWithTimeZone {
    crate::clock::timestamptz(layout::timestamptz_of_ms(ms, 0))
}

/// Unix milliseconds of a finite `timestamptz`, rounded down, for `layout`.
fn unix_ms_of(ts: TimestampWithTimeZone, layout: &Layout) -> i64 {
    if !ts.is_finite() {
        out_of_range(layout).raise()
    }
    layout::unix_ms_of_timestamptz(ts.into())
}

fn decoded(id: i64, layout: &str) -> Decoded {
    let layout = layout_of(layout);
    layout.decode(id).map_err(value_error(&layout)).or_raise()
}

/// The time of a 64-bit ID in a named layout (the `ts` of `id_decode(id, layout)`).
#[pg_extern(immutable, parallel_safe, strict)]
fn id_layout_ts(id: i64, layout: &str) -> TimestampWithTimeZone {
    timestamptz_of_unix_ms(decoded(id, layout).unix_ms)
}

/// The node (shard, machine, or Discord's worker and process) of a 64-bit ID in a named layout.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_layout_node(id: i64, layout: &str) -> i32 {
    decoded(id, layout).node
}

/// The sequence number of a 64-bit ID in a named layout.
#[pg_extern(immutable, parallel_safe, strict)]
fn id_layout_seq(id: i64, layout: &str) -> i32 {
    decoded(id, layout).seq
}

extension_sql!(
    r#"
CREATE FUNCTION id_decode(id bigint, layout text, OUT ts timestamptz, OUT node int, OUT seq int)
RETURNS record
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $$ SELECT @extschema@.id_layout_ts(id, layout), @extschema@.id_layout_node(id, layout), @extschema@.id_layout_seq(id, layout) $$;
COMMENT ON FUNCTION id_decode(bigint, text) IS
    'The time, node and sequence number of a 64-bit ID in a named layout: pg_idgen, instagram, twitter, discord, sonyflake.';
"#,
    name = "id_decode_layout",
    requires = [id_layout_ts, id_layout_node, id_layout_seq]
);

/// The smallest ID of a named layout that can carry the time unit of `ts`.
#[pg_extern(immutable, parallel_safe, strict, name = "id_lower_bound")]
fn id_lower_bound_layout(ts: TimestampWithTimeZone, layout: &str) -> i64 {
    let layout = layout_of(layout);
    layout.lower_bound(unix_ms_of(ts, &layout)).map_err(value_error(&layout)).or_raise()
}

/// The largest ID of a named layout that can carry the time unit of `ts`.
#[pg_extern(immutable, parallel_safe, strict, name = "id_upper_bound")]
fn id_upper_bound_layout(ts: TimestampWithTimeZone, layout: &str) -> i64 {
    let layout = layout_of(layout);
    layout.upper_bound(unix_ms_of(ts, &layout)).map_err(value_error(&layout)).or_raise()
}

/// A ULID (26 Crockford base32 characters) as the `uuid` of the same 128 bits.
#[pg_extern(immutable, parallel_safe, strict)]
fn ulid_to_uuid(ulid: &str) -> pgrx::Uuid {
    pgrx::Uuid::from_bytes(schemes::ulid_decode(ulid).map_err(text_error("ulid", ulid)).or_raise())
}

/// The ULID text of a `uuid`'s 128 bits; for a UUIDv7 it sorts as the UUIDs do.
#[pg_extern(immutable, parallel_safe, strict)]
fn uuid_to_ulid(u: pgrx::Uuid) -> String {
    schemes::ulid_encode(u.as_bytes())
}

/// The time of a ULID, to the millisecond.
#[pg_extern(immutable, parallel_safe, strict)]
fn ulid_ts(ulid: &str) -> TimestampWithTimeZone {
    let bytes = schemes::ulid_decode(ulid).map_err(text_error("ulid", ulid)).or_raise();
    timestamptz_of_unix_ms(schemes::ulid_unix_ms(&bytes))
}

/// The time of a KSUID (27 base62 characters), to the second.
#[pg_extern(immutable, parallel_safe, strict)]
fn ksuid_ts(ksuid: &str) -> TimestampWithTimeZone {
    let s = schemes::ksuid_unix_seconds(ksuid).map_err(text_error("ksuid", ksuid)).or_raise();
    timestamptz_of_unix_ms(s * 1000)
}

/// The time of a MongoDB ObjectID (24 hexadecimal digits), to the second.
#[pg_extern(immutable, parallel_safe, strict)]
fn objectid_ts(objectid: &str) -> TimestampWithTimeZone {
    let s = schemes::objectid_unix_seconds(objectid).map_err(text_error("objectid", objectid)).or_raise();
    timestamptz_of_unix_ms(s * 1000)
}

#[cfg(any(test, feature = "pg_test"))]
#[pg_schema]
mod tests {
    use crate::testing::{one, sqlstate};
    use pgrx::prelude::*;

    #[pg_test]
    fn range_errors_describe_the_layouts_own_range() {
        use crate::testing::error_of;
        assert_eq!(
            error_of("id_lower_bound('-infinity', 'twitter')"),
            "22008: timestamp out of range for an ID of layout \"twitter\" / \
             An ID of layout \"twitter\" carries a time from 2010-11-04 01:42:54.657 UTC to 2080-07-10 17:30:30.208 UTC."
        );
        assert!(error_of("id_upper_bound('2000-01-01', 'discord')").contains("from 2015-01-01 00:00:00.000 UTC"));
        // Sonyflake counts 10 ms units: its range ends at the end of the last one.
        assert!(error_of("id_lower_bound('-infinity', 'sonyflake')").ends_with("to 2188-11-16 03:28:58.879 UTC."));
        assert_eq!(error_of("id_lower_bound('2188-11-16 03:28:58.879+00', 'sonyflake') > 0"), "ok");
        assert!(error_of("id_lower_bound('2188-11-16 03:28:58.880+00', 'sonyflake')").starts_with("22008"));
        assert!(error_of("id_lower_bound('2000-01-01', 'pg_idgen')").contains("layout \"pg_idgen\" carries a time from 2026-01-01"));
        assert_eq!(
            error_of("id_lower_bound('-infinity')"),
            "22008: timestamp out of range for a pg_idgen ID / \
             An ID carries a time from pg_idgen.epoch to 2^40 milliseconds (about 34.8 years) after it."
        );
    }

    #[pg_test]
    fn published_vectors_decode_in_sql() {
        // Discord's developer documentation, "Snowflakes": 175928847299117063
        // is 2016-04-30 11:18:25.796 UTC, worker 1, process 0, increment 7.
        assert_eq!(
            one::<String>("SELECT id_decode(175928847299117063, 'discord')::text"),
            "(\"2016-04-30 11:18:25.796+00\",32,7)"
        );
        // segmentio/ksuid README: 0ujtsYcgvSTl8PAuAdqWYSMnLOv, 2017-10-09 21:00:47 -0700.
        assert_eq!(one::<String>("SELECT ksuid_ts('0ujtsYcgvSTl8PAuAdqWYSMnLOv')::text"), "2017-10-10 04:00:47+00");
        // MongoDB manual, ObjectId.getTimestamp(): 507c7f79bcf86cd7994f6c0e is 2012-10-15T21:26:17Z.
        assert_eq!(one::<String>("SELECT objectid_ts('507c7f79bcf86cd7994f6c0e')::text"), "2012-10-15 21:26:17+00");
        // ulid/javascript README: 01ARYZ6S41TSV4RRFFQ69G5FAV is 1469918176385 ms.
        assert_eq!(
            one::<String>("SELECT ulid_ts('01ARYZ6S41TSV4RRFFQ69G5FAV')::text"),
            "2016-07-30 22:36:16.385+00"
        );
    }

    #[pg_test]
    fn our_layout_by_name_equals_the_one_argument_functions() {
        let same: bool = one(
            "SELECT bool_and((id_decode(id, 'pg_idgen')).ts = id_ts(id)
                             AND (id_decode(id, 'pg_idgen')).node = id_shard(id)
                             AND (id_decode(id, 'pg_idgen')).seq = id_seq(id)
                             AND id_lower_bound(id_ts(id), 'pg_idgen') = id_lower_bound(id_ts(id))
                             AND id_upper_bound(id_ts(id), 'pg_idgen') = id_upper_bound(id_ts(id)))
               FROM (SELECT next_shard_id(1000 + g % 50) AS id FROM generate_series(1, 2000) g) s",
        );
        assert!(same);
    }

    #[pg_test]
    fn ulids_round_trip_and_sort_like_their_uuids() {
        assert_eq!(
            one::<String>("SELECT uuid_to_ulid(ulid_to_uuid('01arz3ndektsv4rrffq69g5fav'))"),
            "01ARZ3NDEKTSV4RRFFQ69G5FAV"
        );
        assert_eq!(one::<String>("SELECT uuid_to_ulid('ffffffff-ffff-ffff-ffff-ffffffffffff')"), "7ZZZZZZZZZZZZZZZZZZZZZZZZZ");
        let bad: i64 = one(
            "SELECT count(*) FROM (SELECT u, lag(u) OVER (ORDER BY u) AS pu,
                                          uuid_to_ulid(u) COLLATE \"C\" AS t, lag(uuid_to_ulid(u) COLLATE \"C\") OVER (ORDER BY u) AS pt
                                     FROM (SELECT uuid_v7() AS u FROM generate_series(1, 5000)) s) x
              WHERE pt >= t",
        );
        assert_eq!(bad, 0);
    }

    #[pg_test]
    fn bad_names_and_text_have_their_sqlstates() {
        assert_eq!(sqlstate("id_decode(1, 'snowflake')"), "22023");
        assert_eq!(sqlstate("id_lower_bound(now(), 'Twitter')"), "22023");
        assert_eq!(sqlstate("id_decode(-1, 'twitter')"), "22003");
        assert_eq!(sqlstate("id_lower_bound('2000-01-01', 'discord')"), "22008");
        assert_eq!(sqlstate("id_upper_bound('infinity', 'twitter')"), "22008");
        for f in ["ulid_to_uuid", "ulid_ts", "ksuid_ts", "objectid_ts"] {
            for bad in ["''", "'80000000000000000000000000'", "'é'", "repeat('0', 100000)", "'0000000000000000000000000U'"] {
                assert_eq!(sqlstate(&format!("{f}({bad})")), "22P02", "{f}({bad})");
            }
        }
        assert_eq!(sqlstate("ksuid_ts('aWgEPTl1tmebfsQzFP4bxwgy80W')"), "22P02", "above the largest KSUID");
        assert_eq!(sqlstate("objectid_ts('507c7f79bcf86cd7994f6c0g')"), "22P02");
    }

    #[pg_test]
    fn scheme_functions_are_immutable_parallel_safe_and_strict() {
        let rows: String = one(
            "SELECT string_agg(DISTINCT provolatile::text || proparallel::text || proisstrict::text, ',')
               FROM pg_proc WHERE proname IN ('id_layout_ts', 'id_layout_node', 'id_layout_seq', 'ulid_to_uuid',
                 'uuid_to_ulid', 'ulid_ts', 'ksuid_ts', 'objectid_ts')
                 OR (proname IN ('id_decode', 'id_lower_bound', 'id_upper_bound') AND pronargs = 2)",
        );
        assert_eq!(rows, "istrue");
    }
}
