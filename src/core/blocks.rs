//! A statement's blocks of IDs minted by another node (see `citus`): IDs
//! fetched for one shard or schema in the current statement, not yet handed
//! out.
//!
//! Each fetch takes twice as many as the last, from 1 up to [`MAX_BLOCK`]:
//! a statement that mints one row pays one round trip and skips no ID; one
//! that mints 20,000 pays 29. Every ID of a block was minted after the
//! statement began, so it is above every ID of its shard acknowledged
//! before; those left when the statement ends are skipped, never handed
//! out. A statement's IDs of one shard rise in the order it takes them,
//! whichever of its calls takes them; IDs of statements running at once
//! interleave.

use std::collections::VecDeque;

/// The most IDs one round trip fetches: a millisecond's worth of one shard.
pub const MAX_BLOCK: u32 = 1024;

/// The most shards and schemas one statement keeps blocks for; past it the
/// blocks start over (bounding a backend's memory).
pub const MAX_BLOCKS: usize = 64;

struct Block<K> {
    key: K,
    ids: VecDeque<i64>,
    /// How many IDs the next fetch takes.
    next: u32,
    /// The logical shard of its IDs, once fetched.
    shard: Option<i32>,
}

/// The blocks of statement `S` (whatever tells one statement from the
/// next), by what they hold IDs of, `K`.
pub struct Blocks<S, K> {
    of: Option<S>,
    blocks: Vec<Block<K>>,
}

impl<S: PartialEq, K: PartialEq + Clone> Blocks<S, K> {
    pub const fn new() -> Self {
        Blocks { of: None, blocks: Vec::new() }
    }

    /// The next ID of `key` in `statement`, or how many to fetch: another
    /// statement's blocks are dropped first.
    pub fn take(&mut self, statement: S, key: &K) -> Result<i64, u32> {
        if self.of.as_ref() != Some(&statement) || self.blocks.len() >= MAX_BLOCKS && !self.blocks.iter().any(|b| b.key == *key) {
            self.of = Some(statement);
            self.blocks.clear();
        }
        match self.blocks.iter_mut().find(|b| b.key == *key) {
            Some(b) => b.ids.pop_front().ok_or(b.next),
            None => {
                self.blocks.push(Block { key: key.clone(), ids: VecDeque::new(), next: 1, shard: None });
                Err(1)
            }
        }
    }

    /// Keeps `ids` of logical shard `shard`, the rest of `n` fetched for
    /// `key` (the first was handed out). Another key's block of the same
    /// shard (`next_shard_id` of a schema's shard beside `next_schema_id`)
    /// holds IDs below these: it is emptied, never handed out after them.
    pub fn fill(&mut self, key: &K, ids: VecDeque<i64>, n: u32, shard: i32) {
        for b in self.blocks.iter_mut().filter(|b| b.key != *key && b.shard == Some(shard)) {
            b.ids.clear();
        }
        if let Some(b) = self.blocks.iter_mut().find(|b| b.key == *key) {
            *b = Block { key: key.clone(), ids, next: (n * 2).min(MAX_BLOCK), shard: Some(shard) };
        }
    }
}

impl<S: PartialEq, K: PartialEq + Clone> Default for Blocks<S, K> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes one ID of `key` in `statement`, fetching as a node would:
    /// consecutive IDs from `*next`, of shard `shard`. Counts fetches.
    fn take(b: &mut Blocks<u32, &'static str>, statement: u32, key: &'static str, shard: i32, next: &mut i64, fetches: &mut Vec<u32>) -> i64 {
        match b.take(statement, &key) {
            Ok(id) => id,
            Err(n) => {
                fetches.push(n);
                let mut ids: VecDeque<i64> = (*next..*next + n as i64).collect();
                *next += n as i64;
                let first = ids.pop_front().unwrap();
                b.fill(&key, ids, n, shard);
                first
            }
        }
    }

    #[test]
    fn fetches_double_up_to_a_millisecond_and_ids_are_handed_out_in_order() {
        let mut b = Blocks::new();
        let (mut next, mut fetches) = (0, Vec::new());
        let ids: Vec<i64> = (0..20_000).map(|_| take(&mut b, 1, "s", 3, &mut next, &mut fetches)).collect();
        assert_eq!(ids, (0..20_000).collect::<Vec<i64>>());
        assert_eq!(fetches.len(), 29);
        assert_eq!(&fetches[..12], &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024]);
    }

    #[test]
    fn a_new_statement_skips_what_is_left_and_starts_at_one() {
        let mut b = Blocks::new();
        let (mut next, mut fetches) = (0, Vec::new());
        for _ in 0..4 {
            take(&mut b, 1, "s", 3, &mut next, &mut fetches);
        }
        // 1 + 2 + 4 fetched, 4 taken: 3 left, never handed out.
        assert_eq!(take(&mut b, 2, "s", 3, &mut next, &mut fetches), 7);
        assert_eq!(fetches, [1, 2, 4, 1]);
    }

    #[test]
    fn another_key_of_the_same_shard_is_emptied_by_a_fetch() {
        let mut b = Blocks::new();
        let (mut next, mut fetches) = (0, Vec::new());
        for _ in 0..2 {
            take(&mut b, 1, "schema", 3, &mut next, &mut fetches);
        }
        // "schema" holds 2 (fetched 1 then 2: IDs 1 and 2, 1 taken).
        let by_number = take(&mut b, 1, "shard 3", 3, &mut next, &mut fetches);
        assert_eq!(by_number, 3);
        // The schema's leftover 2 is below 3: a fresh fetch, not 2.
        assert_eq!(take(&mut b, 1, "schema", 3, &mut next, &mut fetches), 4);
        // A key of another shard keeps its block.
        take(&mut b, 1, "other", 9, &mut next, &mut fetches);
        take(&mut b, 1, "other", 9, &mut next, &mut fetches);
        let before = fetches.len();
        take(&mut b, 1, "shard 3", 3, &mut next, &mut fetches);
        assert_eq!(take(&mut b, 1, "other", 9, &mut next, &mut fetches), 10);
        assert_eq!(fetches.len(), before + 1);
    }

    #[test]
    fn past_max_blocks_a_new_key_starts_the_blocks_over() {
        let mut b: Blocks<u32, usize> = Blocks::new();
        for k in 0..MAX_BLOCKS {
            assert_eq!(b.take(1, &k), Err(1));
            b.fill(&k, VecDeque::from([10 * k as i64 + 1]), 1, k as i32);
        }
        // A known key still has its block.
        assert_eq!(b.take(1, &0), Ok(1));
        assert_eq!(b.blocks.len(), MAX_BLOCKS);
        // A new one clears them all.
        assert_eq!(b.take(1, &MAX_BLOCKS), Err(1));
        assert_eq!(b.blocks.len(), 1);
        assert_eq!(b.take(1, &1), Err(1));
    }
}
