//! Shard leases, the decisions in plain Rust: which shards a server asks a
//! lease store for, how long a renewed lease lets it mint (fencing by time),
//! and the mark it files in the store above every ID it may mint.
//!
//! The rules, which the keeper (`crate::lease`) applies:
//! - a lease granted or renewed by a request sent at monotonic time `t`
//!   with TTL `ttl` lets the server mint until `t + ttl - margin`: the
//!   store counts the TTL from when it receives the request, later than
//!   `t`, and gives the shard to another server only once it has run out;
//! - before a renewal takes effect, the holder files in the store, for
//!   each of its shards, a mark (Unix ms) at or above its clock at the end
//!   of the new validity plus the lead bound; the generator never hands out
//!   an ID above the mark it filed, and the next holder starts above it.
//!   So two holders never mint the same ID, whatever the clocks and pauses:
//!   a holder paused past its lease finds, on waking, its validity over,
//!   and its mark was filed before any of its IDs could pass it.

use super::layout::{MAX_MS, MAX_SHARD};

/// The fencing margin for a TTL: how much earlier than the store the
/// holder stops minting. It covers the time the request takes to reach the
/// store only in the holder's favour (that time is already on the safe
/// side); it is there for the drift between the two monotonic clocks
/// (parts per million, so microseconds over a TTL) and for a mint that
/// checked the lease just before it ran out. At least one second, and a
/// fifth of longer TTLs.
pub fn margin_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 5).max(1000)
}

/// The monotonic time (ns) until which a lease renewed by a request sent
/// at `sent_ns`, granted `ttl_ms`, lets the server mint, read on a clock
/// that lags true time by up to `clock_res_ns` (a coarse clock: a reading
/// taken after the deadline may show a time before it by that much).
pub fn valid_until_ns(sent_ns: u64, ttl_ms: u64, clock_res_ns: u64) -> u64 {
    let ms = ttl_ms.saturating_sub(margin_ms(ttl_ms));
    sent_ns.saturating_add(ms.saturating_mul(1_000_000)).saturating_sub(clock_res_ns).max(sent_ns)
}

/// How often the keeper renews: three times per TTL, so that one renewal
/// lost to the network still leaves two before the lease runs out.
pub fn renew_every_ms(ttl_ms: u64) -> u64 {
    (ttl_ms / 3).max(200)
}

/// The deadline of a renewal, as [`valid_until_ns`]; following a leader
/// key, no later than one renewal interval and one margin after it: the
/// marks filed are that much nearer the clock, so that an elected primary
/// that takes over a silent one's shard (starting above its mark) mints
/// soon after that one's last renewal rather than after its whole TTL. A
/// renewal later than that pauses minting until it is done.
pub fn deadline_ns(sent_ns: u64, ttl_ms: u64, clock_res_ns: u64, follows_leader: bool) -> u64 {
    let until = valid_until_ns(sent_ns, ttl_ms, clock_res_ns);
    let near_ms = renew_every_ms(ttl_ms) + margin_ms(ttl_ms);
    let near = sent_ns.saturating_add(near_ms.saturating_mul(1_000_000)).saturating_sub(clock_res_ns).max(sent_ns);
    match follows_leader {
        true => until.min(near),
        false => until,
    }
}

/// The mark filed for a holder's shard before a renewal takes effect (Unix
/// ms): its clock `wall_ms` now, plus the validity left (`valid_for_ms`),
/// plus the lead bound that lets a generator run ahead of its clock.
pub fn mark_ms(wall_ms: i64, valid_for_ms: u64, lead_ms: i64) -> i64 {
    wall_ms.saturating_add(valid_for_ms as i64).saturating_add(lead_ms.max(0))
}

/// A shard's mark as filed in the store: the mark (Unix ms) and the epoch
/// (Unix ms) of the IDs it bounds, so that a server with another epoch,
/// whose IDs count from elsewhere, never takes the shard.
pub fn mark_value(mark_ms: i64, epoch_ms: i64) -> String {
    format!("{mark_ms} {epoch_ms}")
}

/// A filed mark read back: `Ok(None)` when none was filed (a shard no
/// server held before), an error when the value cannot be read or was
/// filed under another epoch.
pub fn read_mark(value: Option<&str>, epoch_ms: i64) -> Result<Option<i64>, String> {
    let Some(value) = value else { return Ok(None) };
    let mut words = value.split_whitespace();
    let (Some(mark), Some(epoch), None) = (words.next(), words.next(), words.next()) else {
        return Err(format!("the mark \"{}\" cannot be read", value.chars().take(60).collect::<String>()));
    };
    let (Ok(mark), Ok(epoch)) = (mark.parse::<i64>(), epoch.parse::<i64>()) else {
        return Err(format!("the mark \"{}\" cannot be read", value.chars().take(60).collect::<String>()));
    };
    if !(epoch_ms..=epoch_ms.saturating_add(MAX_MS)).contains(&mark) {
        return Err(format!("the mark {mark} is outside the range of this epoch's IDs"));
    }
    if epoch != epoch_ms {
        return Err(format!(
            "the mark was filed by a server whose pg_idgen.epoch is {epoch} ms after 1970, not {epoch_ms}: servers sharing shards share the epoch"
        ));
    }
    Ok(Some(mark))
}

/// `pg_idgen.lease_prefix` as keys use it: ending in `/`.
pub fn normalized_prefix(prefix: &str) -> String {
    let p = prefix.trim();
    if p.is_empty() {
        "/pg_idgen/".into()
    } else if p.ends_with('/') {
        p.to_string()
    } else {
        format!("{p}/")
    }
}

/// A list of shards as `pg_idgen.lease_shards` takes it: numbers and
/// ranges, comma-separated (`5`, `0-99,200`); empty means none. Sorted,
/// without repeats.
pub fn parse_shards(spec: &str) -> Result<Vec<u16>, String> {
    let mut shards = Vec::new();
    for part in spec.split(',').map(str::trim) {
        if part.is_empty() {
            if spec.trim().is_empty() {
                continue;
            }
            return Err(format!("empty item in \"{spec}\""));
        }
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (number(a, spec)?, number(b, spec)?),
            None => (number(part, spec)?, number(part, spec)?),
        };
        if first > last {
            return Err(format!("range \"{part}\" runs backwards"));
        }
        shards.extend(first..=last);
    }
    shards.sort_unstable();
    shards.dedup();
    Ok(shards)
}

fn number(text: &str, spec: &str) -> Result<u16, String> {
    let text = text.trim();
    match text.parse::<u16>() {
        Ok(n) if i32::from(n) <= MAX_SHARD => Ok(n),
        Ok(_) => Err(format!("shard {text} is out of range 0 to {MAX_SHARD}")),
        Err(_) => Err(format!("\"{text}\" in \"{spec}\" is not a shard number")),
    }
}

/// What the keeper knows of one shard's key in the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// No key: any server may take it.
    Free,
    /// Held under this server's lease.
    Mine,
    /// Held by another server (or an earlier start of this one).
    Other,
}

/// The shards to ask for, in order, given what each wanted shard looks
/// like in the store (`seen`, by shard). `named` are always asked for;
/// beyond them, `auto` more are, the shards this server held before its
/// restart first (`preferred`), then the lowest free ones. While
/// `patient` (the first TTL and a half after the keeper started) no new
/// free shard is taken in place of a preferred one that another lease
/// still holds: a server that restarted before its old lease ran out
/// gets its shards back rather than new ones.
pub fn to_ask(
    named: &[u16],
    auto: usize,
    preferred: &[u16],
    patient: bool,
    seen: impl Fn(u16) -> Seen,
) -> Vec<u16> {
    let mut ask: Vec<u16> = named.iter().copied().filter(|s| seen(*s) != Seen::Mine).collect();
    let mine_auto = (0..=MAX_SHARD as u16).filter(|s| seen(*s) == Seen::Mine && !named.contains(s)).count();
    let mut missing = auto.saturating_sub(mine_auto);
    for s in preferred.iter().copied().filter(|s| !named.contains(s)) {
        if missing == 0 {
            break;
        }
        match seen(s) {
            Seen::Free => {
                ask.push(s);
                missing -= 1;
            }
            // Still leased: hold a place for it while patient.
            Seen::Other if patient => missing -= 1,
            _ => {}
        }
    }
    for s in 0..=MAX_SHARD as u16 {
        if missing == 0 {
            break;
        }
        if seen(s) == Seen::Free && !named.contains(&s) && !ask.contains(&s) {
            ask.push(s);
            missing -= 1;
        }
    }
    ask
}

/// The value a holder writes in a shard's key: who holds it, as one line
/// (`<identity> <system identifier> <leader key, or -> <description>`).
pub fn owner_value(identity: &str, system_id: u64, leader_key: Option<&str>, description: &str) -> String {
    format!("{identity} {system_id} {} {description}", leader_key.unwrap_or("-"))
}

/// The leader key an owner value follows, if any (a key starts with `/`).
pub fn owner_leader_key(value: &str) -> Option<&str> {
    value.split(' ').nth(2).filter(|k| k.starts_with('/'))
}

/// The identity and system identifier of an owner value.
pub fn owner_of(value: &str) -> (&str, Option<u64>) {
    let mut words = value.splitn(3, ' ');
    let identity = words.next().unwrap_or("");
    (identity, words.next().and_then(|w| w.parse().ok()))
}

/// `pg_idgen.lease_leader_key` read: the key of a writer election (Patroni's
/// leader key, `<namespace><scope>/leader`) and the value by which it names
/// this server (its member name), written `key=value` (the key holds no
/// `=`); empty means none. Neither part may hold white space.
pub fn parse_leader(spec: &str) -> Result<Option<(String, String)>, String> {
    let spec = spec.trim();
    if spec.is_empty() {
        return Ok(None);
    }
    match spec.split_once('=') {
        Some((key, name))
            if !key.trim().is_empty()
                && !name.trim().is_empty()
                && !key.trim().contains(char::is_whitespace)
                && !name.trim().contains(char::is_whitespace) =>
        {
            Ok(Some((key.trim().to_string(), name.trim().to_string())))
        }
        _ => Err(format!(
            "\"{spec}\" is not of the form key=name (Patroni's leader key and this member's name, without spaces)"
        )),
    }
}

/// What the leader key says, read in the keeper's round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Leader {
    /// No leader key configured: leases alone decide.
    Unused,
    /// Configured, and the key is absent (no writer elected).
    Absent,
    /// The key names this server.
    Me,
    /// The key names another server, as given.
    Other(String),
}

impl Leader {
    pub fn of(value: Option<&str>, name: &str) -> Leader {
        match value {
            None => Leader::Absent,
            Some(v) if v == name => Leader::Me,
            Some(v) => Leader::Other(v.to_string()),
        }
    }
}

/// Whether a server may take a shard held by another lease before that
/// lease runs out (once its holder is silent, see [`missed_renewal`], and
/// only if the election is newer than the holder's key, which the keeper
/// checks in the same transaction): only when the leader key names it, and
/// the holder is an earlier primary of the same data following the same
/// key (same system identifier, another start). The new holder still
/// starts above the mark the old one filed, so whatever the clocks, pauses
/// or elections, the two never mint the same ID. A holder that follows
/// another leader key (a copy of this data in another cluster), or none, is
/// never taken from.
pub fn may_take_over(leader: &Leader, holder: &str, me: &str) -> bool {
    let (identity, system_id) = owner_of(holder);
    let (my_identity, my_system_id) = owner_of(me);
    *leader == Leader::Me
        && system_id.is_some()
        && system_id == my_system_id
        && identity != my_identity
        && owner_leader_key(holder).is_some()
        && owner_leader_key(holder) == owner_leader_key(me)
}

/// Whether a holder's lease, `remaining_s` of its `granted_s` left as the
/// store reports them (whole seconds, rounded down), shows it missed a
/// renewal by more than a second: a holder that runs renews three times
/// per TTL. Only a silent holder (crashed, frozen, cut off) is taken from
/// at once; a deposed one that runs gives its shards back by itself.
pub fn missed_renewal(remaining_s: i64, granted_s: i64) -> bool {
    let granted_ms = granted_s.max(0) as u64 * 1000;
    let since_ms = granted_ms.saturating_sub(remaining_s.max(0) as u64 * 1000 + 1000);
    granted_s > 0 && since_ms > renew_every_ms(granted_ms) + 1000
}

/// The key of a shard's lease, and of its mark, under `prefix`. Numbers
/// are zero-padded so that keys sort as shards do.
pub fn shard_key(prefix: &str, shard: u16) -> String {
    format!("{prefix}shard/{shard:04}")
}

pub fn mark_key(prefix: &str, shard: u16) -> String {
    format!("{prefix}mark/{shard:04}")
}

/// The shard a key under `prefix` names.
pub fn shard_of_key(prefix: &str, key: &str) -> Option<u16> {
    let n: u16 = key.strip_prefix(prefix)?.strip_prefix("shard/")?.parse().ok()?;
    (i32::from(n) <= MAX_SHARD).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_stops_a_margin_before_the_store_can_give_the_shard_away() {
        // TTL 10 s, sent at 5 s: minting until 13 s, the store keeps it
        // until at least 15 s.
        assert_eq!(margin_ms(10_000), 2000);
        assert_eq!(valid_until_ns(5_000_000_000, 10_000, 1), 12_999_999_999);
        // A coarse clock's resolution comes off too.
        assert_eq!(valid_until_ns(5_000_000_000, 10_000, 4_000_000), 12_996_000_000);
        // Short TTLs keep a one-second margin.
        assert_eq!(margin_ms(2_000), 1000);
        assert_eq!(valid_until_ns(0, 2_000, 1), 999_999_999);
        // A TTL shorter than the margin never lets the server mint.
        assert_eq!(valid_until_ns(7, 500, 1), 7);
        assert_eq!(valid_until_ns(7, 1000, 4_000_000), 7);
        for ttl in [1000, 2000, 5000, 10_000, 60_000, 600_000] {
            assert!(valid_until_ns(0, ttl, 1) < ttl * 1_000_000, "{ttl}");
            assert!(renew_every_ms(ttl) * 2 < ttl.saturating_sub(margin_ms(ttl)) || ttl < 3000, "{ttl}");
        }
    }

    #[test]
    fn following_a_leader_key_the_deadline_is_one_renewal_and_one_margin_away() {
        // TTL 15 s: renewals every 5 s, a margin of 3 s: 8 s, not 12 s.
        assert_eq!(deadline_ns(0, 15_000, 1, false), valid_until_ns(0, 15_000, 1));
        assert_eq!(deadline_ns(0, 15_000, 1, true), 8_000_000_000 - 1);
        assert!(deadline_ns(0, 15_000, 1, true) < deadline_ns(0, 15_000, 1, false));
        for ttl in [2_000, 4_000, 10_000, 30_000, 600_000] {
            assert!(deadline_ns(0, ttl, 1, true) <= deadline_ns(0, ttl, 1, false), "{ttl}");
            assert!(deadline_ns(0, ttl, 1, true) > renew_every_ms(ttl) * 1_000_000 || ttl < 3_000, "{ttl}");
        }
    }

    #[test]
    fn the_mark_covers_the_validity_and_the_lead() {
        assert_eq!(mark_ms(1_000_000, 8_000, 10_000), 1_018_000);
        assert_eq!(mark_ms(1_000_000, 8_000, -5), 1_008_000);
        assert_eq!(mark_ms(i64::MAX - 1, 8_000, 10_000), i64::MAX);
    }

    #[test]
    fn marks_carry_their_epoch_and_anything_else_is_refused() {
        let epoch = 1_767_225_600_000;
        assert_eq!(read_mark(Some(&mark_value(1_800_000_000_000, epoch)), epoch), Ok(Some(1_800_000_000_000)));
        assert_eq!(read_mark(None, epoch), Ok(None));
        assert!(read_mark(Some("garbage"), epoch).unwrap_err().contains("cannot be read"));
        assert!(read_mark(Some("12"), epoch).unwrap_err().contains("cannot be read"));
        assert!(read_mark(Some("12 x"), epoch).unwrap_err().contains("cannot be read"));
        assert!(read_mark(Some("12 3 4"), epoch).unwrap_err().contains("cannot be read"));
        assert!(read_mark(Some(&mark_value(epoch + 5, epoch + 60_000)), epoch).unwrap_err().contains("epoch"));
        assert!(read_mark(Some(&mark_value(i64::MAX, epoch)), epoch).unwrap_err().contains("outside"));
        assert!(read_mark(Some(&mark_value(-5, epoch)), epoch).unwrap_err().contains("outside"));
        assert!(read_mark(Some(&mark_value(epoch - 1, epoch)), epoch).unwrap_err().contains("outside"));
    }

    #[test]
    fn prefixes_end_in_a_slash() {
        assert_eq!(normalized_prefix("/pg_idgen"), "/pg_idgen/");
        assert_eq!(normalized_prefix("/a/b/"), "/a/b/");
        assert_eq!(normalized_prefix(" "), "/pg_idgen/");
    }

    #[test]
    fn shard_lists_parse_as_documented() {
        assert_eq!(parse_shards(""), Ok(vec![]));
        assert_eq!(parse_shards("  "), Ok(vec![]));
        assert_eq!(parse_shards("5"), Ok(vec![5]));
        assert_eq!(parse_shards("3-5, 1,4"), Ok(vec![1, 3, 4, 5]));
        assert_eq!(parse_shards("8191"), Ok(vec![8191]));
        assert!(parse_shards("8192").unwrap_err().contains("out of range"));
        assert!(parse_shards("5-3").unwrap_err().contains("backwards"));
        assert!(parse_shards("1,,2").unwrap_err().contains("empty"));
        assert!(parse_shards("x").unwrap_err().contains("not a shard number"));
        assert!(parse_shards("-1").is_err());
    }

    fn seen_from<'a>(mine: &'a [u16], other: &'a [u16]) -> impl Fn(u16) -> Seen + 'a {
        move |s| {
            if mine.contains(&s) {
                Seen::Mine
            } else if other.contains(&s) {
                Seen::Other
            } else {
                Seen::Free
            }
        }
    }

    #[test]
    fn named_shards_are_asked_for_until_held() {
        assert_eq!(to_ask(&[5, 6], 0, &[], false, seen_from(&[], &[5])), vec![5, 6]);
        assert_eq!(to_ask(&[5, 6], 0, &[], false, seen_from(&[5], &[])), vec![6]);
        assert_eq!(to_ask(&[5, 6], 0, &[], false, seen_from(&[5, 6], &[])), Vec::<u16>::new());
    }

    #[test]
    fn automatic_shards_are_the_lowest_free_ones() {
        assert_eq!(to_ask(&[], 3, &[], false, seen_from(&[], &[0, 2])), vec![1, 3, 4]);
        assert_eq!(to_ask(&[1], 2, &[], false, seen_from(&[], &[0])), vec![1, 2, 3]);
        // Held ones count: only the missing are asked for.
        assert_eq!(to_ask(&[], 3, &[], false, seen_from(&[7, 9], &[0])), vec![1]);
        // Named shards held do not count towards the automatic ones.
        assert_eq!(to_ask(&[1], 1, &[], false, seen_from(&[1], &[])), vec![0]);
        // Every shard taken: nothing to ask.
        let all: Vec<u16> = (0..=MAX_SHARD as u16).collect();
        assert_eq!(to_ask(&[], 2, &[], false, seen_from(&[], &all)), Vec::<u16>::new());
    }

    #[test]
    fn a_restarted_server_gets_its_shards_back() {
        // Free again: asked for first.
        assert_eq!(to_ask(&[], 2, &[40, 41], false, seen_from(&[], &[])), vec![40, 41]);
        // Still under the old lease: while patient, no other shard is taken instead.
        assert_eq!(to_ask(&[], 2, &[40, 41], true, seen_from(&[], &[40])), vec![41]);
        // Once patience is over (held by a live server: a copy of this one),
        // the lowest free shard is.
        assert_eq!(to_ask(&[], 2, &[40, 41], false, seen_from(&[], &[40])), vec![41, 0]);
    }

    #[test]
    fn owner_values_and_keys_read_back() {
        let v = owner_value("ab12", 7_345_123, None, "host:5432 pid 9");
        assert_eq!(owner_of(&v), ("ab12", Some(7_345_123)));
        assert_eq!(owner_of("garbage"), ("garbage", None));
        assert_eq!(shard_key("/pg_idgen/", 5), "/pg_idgen/shard/0005");
        assert_eq!(mark_key("/p/", 8191), "/p/mark/8191");
        assert_eq!(shard_of_key("/p/", "/p/shard/0042"), Some(42));
        assert_eq!(shard_of_key("/p/", "/p/shard/9999"), None);
        assert_eq!(shard_of_key("/p/", "/q/shard/0042"), None);
        assert!(shard_key("/p/", 9) < shard_key("/p/", 10));
    }

    #[test]
    fn leader_keys_parse_and_decide_take_overs() {
        assert_eq!(parse_leader(""), Ok(None));
        assert_eq!(
            parse_leader(" /service/batman/leader = node1 "),
            Ok(Some(("/service/batman/leader".into(), "node1".into())))
        );
        for bad in ["/service/batman/leader", "=node1", "/k=", "=", "/a b/leader=n", "/k=n 1"] {
            assert!(parse_leader(bad).unwrap_err().contains("key=name"), "{bad}");
        }
        assert_eq!(Leader::of(None, "n1"), Leader::Absent);
        assert_eq!(Leader::of(Some("n1"), "n1"), Leader::Me);
        assert_eq!(Leader::of(Some("n2"), "n1"), Leader::Other("n2".into()));
        let key = Some("/service/a/leader");
        let old_primary = owner_value("aa", 7, key, "host:5432 data /srv/x leader-key /service/b/leader");
        let me = owner_value("bb", 7, key, "host2:5432");
        assert_eq!(owner_leader_key(&old_primary), key);
        assert_eq!(owner_of(&old_primary), ("aa", Some(7)));
        // Named leader, same data, same election, another start: taken at once.
        assert!(may_take_over(&Leader::Me, &old_primary, &me));
        // Not the leader, or no election: waits for the lease to run out.
        for leader in [Leader::Unused, Leader::Absent, Leader::Other("n2".into())] {
            assert!(!may_take_over(&leader, &old_primary, &me), "{leader:?}");
        }
        // Another system identifier, this very start, a copy in another
        // election or in none: never.
        assert!(!may_take_over(&Leader::Me, &owner_value("aa", 8, key, "h"), &me));
        assert!(!may_take_over(&Leader::Me, &owner_value("bb", 7, key, "h"), &me));
        assert!(!may_take_over(&Leader::Me, &owner_value("aa", 7, Some("/service/b/leader"), "h"), &me));
        assert!(!may_take_over(&Leader::Me, &owner_value("aa", 7, None, "h leader-key /service/a/leader"), &me));
        assert!(!may_take_over(&Leader::Me, &old_primary, &owner_value("bb", 7, None, "h")));
        // A value of 0.9.0 (no leader key field): never taken from.
        assert!(!may_take_over(&Leader::Me, "aa 7 host:5432 postmaster 9 data /x", &me));
        assert!(!may_take_over(&Leader::Me, "garbage", &me));
        assert!(!may_take_over(&Leader::Me, "", &me));
        // A 15 s lease renewed every 5 s: 7 s left (at least 7 s since the
        // renewal, rounded down) is one missed by more than a second.
        assert!(!missed_renewal(15, 15));
        assert!(!missed_renewal(9, 15));
        assert!(!missed_renewal(8, 15));
        assert!(missed_renewal(7, 15));
        assert!(missed_renewal(0, 15));
        assert!(!missed_renewal(-1, 0));
    }
}
