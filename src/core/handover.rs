//! The file in which a Citus worker records the hand-overs of logical
//! shards it took and released (see `citus::handover`): one line a shard,
//! `<shard> <hand-over> held|released <after> <schema OID>`.

/// Shard `shard` was taken by this node in hand-over `handover` above
/// `after`, for the schema of OID `schema` (`held`), or released in
/// hand-over `handover` (not `held`).
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    pub shard: i32,
    pub handover: i64,
    pub held: bool,
    pub after: i64,
    pub schema: u32,
}

/// The entries of a file's text; a line that does not read as one is left out.
pub fn parse(text: &str) -> Vec<Entry> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(' ');
            let entry = Entry {
                shard: f.next()?.parse().ok()?,
                handover: f.next()?.parse().ok()?,
                held: match f.next()? {
                    "held" => true,
                    "released" => false,
                    _ => return None,
                },
                after: f.next()?.parse().ok()?,
                schema: f.next()?.parse().ok()?,
            };
            f.next().is_none().then_some(entry)
        })
        .collect()
}

/// The file's text `text` with `entry` in place of its shard's entry.
pub fn set(text: &str, entry: Entry) -> String {
    let mut entries = parse(text);
    entries.retain(|e| e.shard != entry.shard);
    entries.push(entry);
    entries
        .iter()
        .map(|e| format!("{} {} {} {} {}\n", e.shard, e.handover, if e.held { "held" } else { "released" }, e.after, e.schema))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(shard: i32, handover: i64, held: bool) -> Entry {
        Entry { shard, handover, held, after: 1 << 40, schema: 16_384 + shard as u32 }
    }

    #[test]
    fn entries_read_back_as_written_one_per_shard() {
        let text = set("", entry(7, 1, true));
        let text = set(&text, entry(9, 2, true));
        let text = set(&text, entry(7, 3, false));
        assert_eq!(parse(&text), [entry(9, 2, true), entry(7, 3, false)]);
        assert_eq!(text.lines().count(), 2);
        assert_eq!(text.lines().last(), Some("7 3 released 1099511627776 16391"));
    }

    #[test]
    fn lines_that_are_not_entries_are_left_out() {
        let text = "7 1 held 5 16384\n8 x held 5 1\n9 1 kept 5 1\n10 1 held 5\n11 1 held 5 1 extra\n\n12 2 released 6 0\n";
        assert_eq!(parse(text).iter().map(|e| e.shard).collect::<Vec<_>>(), [7, 12]);
    }
}
