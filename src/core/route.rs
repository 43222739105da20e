//! Who mints a call on a Citus cluster, decided in one place: mint here,
//! take the shard over or back first, send the call to one other node, or
//! refuse and say why. Pure: the Citus glue gathers the facts (Citus's
//! metadata, the hand-over record, this node's generator), asks once, and
//! acts on the answer.
//!
//! A call passes at most one node before the one that mints it, and only
//! a worker that does not know where a shard is sends it to the
//! coordinator: a node group's own shard (`next_node_id`) is minted by the
//! node of that group, a distributed schema's shard by the node holding
//! the schema's data, every other shard by the coordinator.

use crate::core::layout::MAX_SHARD;

/// Node groups with a logical shard of their own: groups 0 to 1023 mint
/// shards 8191 down to 7168.
pub const NODE_GROUPS: i32 = 1024;

/// The logical shard node group `group` mints for `next_node_id()`,
/// counted down from the top of the range (the coordinator, group 0,
/// mints 8191), as Citus gives each group its own range of a `bigserial`.
pub fn node_shard(group: i32) -> Option<i32> {
    (0..NODE_GROUPS).contains(&group).then(|| MAX_SHARD - group)
}

/// The node group whose own shard `shard` is, if it is one.
pub fn node_group_of(shard: i32) -> Option<i32> {
    (MAX_SHARD - NODE_GROUPS < shard && shard <= MAX_SHARD).then(|| MAX_SHARD - shard)
}

/// What is minted for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `next_node_id()`: this node group's own shard.
    Node,
    /// `next_shard_id(n)`.
    Shard(i32),
    /// `next_schema_id(name)`.
    Schema,
}

/// What the node deciding knows about the call.
#[derive(Clone, Copy, Debug, Default)]
pub struct Facts {
    /// This node's group: 0 is the coordinator.
    pub group: i32,
    /// Nodes the call passed before this one (0: a client called here).
    pub hop: usize,
    /// The node group holding the data of the call's schema (for a shard,
    /// of the schema registered for it, where this node knows that): None
    /// when the schema is not distributed, has no tables yet, or is unknown.
    pub holder: Option<i32>,
    /// On a worker: it took the shard over, for the schema whose data it holds.
    pub taken_here: bool,
    /// On the coordinator: the group a hand-over gave the shard to last
    /// (0: none, or the coordinator itself).
    pub recorded: i32,
    /// This node's generator of the shard was released by a hand-over.
    pub released_here: bool,
    /// The metadata was read after that release was seen.
    pub fresh: bool,
    /// For another group's own shard: whether Citus lists a node in that group.
    pub group_listed: bool,
    /// For a schema's call, the schema's shard where this node knows it
    /// (the coordinator's registry, the shard a worker took for it).
    pub shard: Option<i32>,
    /// Node groups mint shards of their own: the extension's objects here
    /// are of a version that has them (0.11.0). Before the update (while a
    /// cluster's nodes restart onto the new library one by one), shards
    /// 7168 to 8191 are minted as any other shard, as before.
    pub node_shards: bool,
    /// Citus lists at least one active node here (its own test of a
    /// coordinator, with group 0): false on a node never added, or whose
    /// metadata was cleared, which also says group 0.
    pub in_cluster: bool,
}

/// Where to send a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Coordinator,
    /// The node holding the schema's data.
    Holder,
    /// The node of a group, for that group's own shard.
    Group(i32),
}

/// What the decision says to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Mint here.
    Here,
    /// The coordinator takes the shard back from the worker that took it
    /// (`renew`: its own release was never recorded), then mints here.
    TakeBack { renew: bool },
    /// The coordinator hands the shard over to this worker, which holds
    /// the schema's data; then it mints here.
    TakeOver,
    /// Send the call, as it is, to that node.
    Send(Node),
    /// Read the metadata again and decide once more: a hand-over released
    /// the shard here since it was read.
    Reread,
    Refuse(Refusal),
}

/// Why a node refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Another node sent a call this node would send on: the two nodes'
    /// metadata disagree (as for a moment while data moves).
    Misrouted,
    /// Another node sent a call only the coordinator can route: that
    /// node's metadata names this worker as its coordinator.
    WorkerAsCoordinator,
    /// `next_node_id()` on a node of a group with no shard of its own.
    GroupWithoutShard(i32),
    /// Another group's own shard, where Citus lists no node in that group.
    NoNodeInGroup(i32),
    /// `next_node_id()` on a node in no cluster's metadata (group 0 says nothing then).
    NotInCluster,
    /// A schema's shard that is a node group's own (registered before 0.11.0, or written into the registry by hand).
    SchemaAtNodeShard(i32),
}

/// Who mints `call`, by what `f` says.
pub fn decide(call: Call, f: Facts) -> Decision {
    let node_group = |shard: i32| if f.node_shards { node_group_of(shard) } else { None };
    let shard_of_group = match call {
        Call::Node if f.group == 0 && !f.in_cluster => return Decision::Refuse(Refusal::NotInCluster),
        Call::Node => return node_shard(f.group).map_or(Decision::Refuse(Refusal::GroupWithoutShard(f.group)), |_| Decision::Here),
        Call::Shard(shard) => node_group(shard),
        Call::Schema => None,
    };
    if let Some(group) = shard_of_group {
        return if group == f.group {
            Decision::Here
        } else if f.hop > 0 {
            Decision::Refuse(Refusal::Misrouted)
        } else if !f.group_listed {
            Decision::Refuse(Refusal::NoNodeInGroup(group))
        } else {
            Decision::Send(Node::Group(group))
        };
    }
    let at_node_shard = call == Call::Schema && f.shard.and_then(node_group).is_some();
    match f.holder {
        // The schema's data is on another node: it mints. A call passes
        // one node before it, two where the first did not know the shard's
        // schema (a worker asks the coordinator, which knows the registry)
        // or where the first node's metadata was older: never three.
        Some(holder) if holder != f.group => {
            if f.hop > 1 { Decision::Refuse(Refusal::Misrouted) } else { Decision::Send(Node::Holder) }
        }
        // A schema at a node group's shard is never minted: the coordinator
        // refuses, a holder that took it asks for the schema's shard anew.
        _ if at_node_shard && f.group == 0 => Decision::Refuse(Refusal::SchemaAtNodeShard(f.shard.unwrap_or_default())),
        Some(_) if at_node_shard => Decision::TakeOver,
        _ if f.released_here && !f.fresh => Decision::Reread,
        _ if f.group == 0 => {
            if f.released_here || f.recorded != 0 {
                Decision::TakeBack { renew: f.released_here }
            } else {
                Decision::Here
            }
        }
        // A worker holding the schema's data.
        Some(_) if f.taken_here && !f.released_here => Decision::Here,
        Some(_) => Decision::TakeOver,
        // A worker that does not know: the coordinator routes it.
        None if f.hop > 0 => Decision::Refuse(Refusal::WorkerAsCoordinator),
        None => Decision::Send(Node::Coordinator),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const COORDINATOR: i32 = 0;
    const W1: i32 = 1;
    const W2: i32 = 2;

    fn at(group: i32, hop: usize) -> Facts {
        Facts { group, hop, group_listed: true, node_shards: true, in_cluster: true, ..Facts::default() }
    }

    fn held_by(holder: i32, f: Facts) -> Facts {
        Facts { holder: Some(holder), ..f }
    }

    #[test]
    fn node_shards_count_down_from_the_top() {
        assert_eq!(node_shard(0), Some(8191));
        assert_eq!(node_shard(1), Some(8190));
        assert_eq!(node_shard(1023), Some(7168));
        assert_eq!(node_shard(1024), None);
        assert_eq!(node_shard(-1), None);
        for group in 0..NODE_GROUPS {
            assert_eq!(node_group_of(node_shard(group).unwrap()), Some(group));
        }
        assert_eq!(node_group_of(7167), None);
        assert_eq!(node_group_of(0), None);
        assert_eq!(node_group_of(8192), None);
    }

    #[test]
    fn a_node_mints_its_own_shard_with_no_call_anywhere() {
        for group in [COORDINATOR, W1, W2, 1023] {
            for hop in [0, 1, 2] {
                // Whatever else is known: nothing else is asked.
                let f = Facts { holder: Some(5), released_here: true, recorded: 3, ..at(group, hop) };
                assert_eq!(decide(Call::Node, f), Decision::Here);
            }
        }
        assert_eq!(decide(Call::Node, at(1024, 0)), Decision::Refuse(Refusal::GroupWithoutShard(1024)));
        // Group 0 in no cluster's metadata: a worker whose metadata was cleared says 0 too.
        assert_eq!(decide(Call::Node, Facts { in_cluster: false, ..at(COORDINATOR, 0) }), Decision::Refuse(Refusal::NotInCluster));
        assert_eq!(decide(Call::Node, Facts { in_cluster: false, ..at(W1, 0) }), Decision::Here);
    }

    #[test]
    fn before_the_update_node_shards_are_shards_like_any_other() {
        let old = |f: Facts| Facts { node_shards: false, ..f };
        assert_eq!(decide(Call::Shard(8190), old(at(COORDINATOR, 0))), Decision::Here);
        assert_eq!(decide(Call::Shard(8190), old(at(W2, 0))), Decision::Send(Node::Coordinator));
        assert_eq!(decide(Call::Schema, old(Facts { shard: Some(8190), ..at(COORDINATOR, 0) })), Decision::Here);
    }

    #[test]
    fn a_schema_at_a_node_groups_shard_is_never_minted_as_the_schemas() {
        // The registry names shard 8190 (group 1's) for a schema: the
        // coordinator refuses; the worker holding the data asks the
        // coordinator for the schema's shard again (which refuses too, or
        // gives the new one); others send it on, and it meets one of those.
        let f = Facts { shard: Some(8190), ..at(COORDINATOR, 0) };
        assert_eq!(decide(Call::Schema, f), Decision::Refuse(Refusal::SchemaAtNodeShard(8190)));
        assert_eq!(decide(Call::Schema, Facts { recorded: W2, ..f }), Decision::Refuse(Refusal::SchemaAtNodeShard(8190)));
        let holder = Facts { shard: Some(8190), taken_here: true, ..held_by(W2, at(W2, 0)) };
        assert_eq!(decide(Call::Schema, holder), Decision::TakeOver);
        assert_eq!(decide(Call::Schema, Facts { hop: 1, ..holder }), Decision::TakeOver);
        assert_eq!(decide(Call::Schema, held_by(W2, at(W1, 0))), Decision::Send(Node::Holder));
        // The shard itself is group 1's, whatever the registry says.
        assert_eq!(decide(Call::Shard(8190), held_by(W2, at(W2, 0))), Decision::Send(Node::Group(1)));
    }

    #[test]
    fn another_groups_shard_goes_straight_to_its_node_once() {
        // next_shard_id(8190) is group 1's: minted there, by any way in.
        assert_eq!(decide(Call::Shard(8190), at(W1, 0)), Decision::Here);
        assert_eq!(decide(Call::Shard(8190), at(W1, 1)), Decision::Here);
        assert_eq!(decide(Call::Shard(8190), at(W2, 0)), Decision::Send(Node::Group(1)));
        assert_eq!(decide(Call::Shard(8190), at(COORDINATOR, 0)), Decision::Send(Node::Group(1)));
        // Never by the coordinator, even when it has a record or no node is listed.
        let gone = Facts { group_listed: false, ..at(COORDINATOR, 0) };
        assert_eq!(decide(Call::Shard(8190), gone), Decision::Refuse(Refusal::NoNodeInGroup(1)));
        // Sent to a node that is not in the group: never sent on.
        assert_eq!(decide(Call::Shard(8190), at(W2, 1)), Decision::Refuse(Refusal::Misrouted));
        assert_eq!(decide(Call::Shard(8190), at(COORDINATOR, 1)), Decision::Refuse(Refusal::Misrouted));
    }

    #[test]
    fn a_schemas_shard_is_minted_where_its_data_is() {
        // The holder, having taken the shard over: here, whoever sent it.
        for hop in [0, 1, 2] {
            let f = Facts { taken_here: true, ..held_by(W1, at(W1, hop)) };
            assert_eq!(decide(Call::Schema, f), Decision::Here);
            assert_eq!(decide(Call::Shard(101), f), Decision::Here);
        }
        // The holder, not yet: the coordinator hands it over first.
        assert_eq!(decide(Call::Schema, held_by(W1, at(W1, 0))), Decision::TakeOver);
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(W1, 1))), Decision::TakeOver);
        // Any other node: straight to the holder, the coordinator not on the path.
        assert_eq!(decide(Call::Schema, held_by(W1, at(W2, 0))), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(W2, 0))), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Schema, held_by(W1, at(COORDINATOR, 0))), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(COORDINATOR, 0))), Decision::Send(Node::Holder));
        // The coordinator holding it mints it.
        assert_eq!(decide(Call::Schema, held_by(COORDINATOR, at(COORDINATOR, 0))), Decision::Here);
    }

    #[test]
    fn a_call_is_sent_on_at_most_twice() {
        // Sent on by the coordinator (a worker that did not know the shard's schema).
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(COORDINATOR, 1))), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(COORDINATOR, 2))), Decision::Refuse(Refusal::Misrouted));
        // Sent to a node whose newer metadata places the data elsewhere.
        assert_eq!(decide(Call::Schema, held_by(W1, at(W2, 1))), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(W2, 1))), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Schema, held_by(W1, at(W2, 2))), Decision::Refuse(Refusal::Misrouted));
        assert_eq!(decide(Call::Shard(101), held_by(W1, at(W2, 2))), Decision::Refuse(Refusal::Misrouted));
    }

    #[test]
    fn every_other_shard_is_the_coordinators() {
        assert_eq!(decide(Call::Shard(8), at(COORDINATOR, 0)), Decision::Here);
        assert_eq!(decide(Call::Shard(8), at(COORDINATOR, 1)), Decision::Here);
        assert_eq!(decide(Call::Schema, at(COORDINATOR, 0)), Decision::Here);
        assert_eq!(decide(Call::Shard(8), at(W1, 0)), Decision::Send(Node::Coordinator));
        assert_eq!(decide(Call::Schema, at(W1, 0)), Decision::Send(Node::Coordinator));
        // A worker never routes for another node.
        assert_eq!(decide(Call::Shard(8), at(W1, 1)), Decision::Refuse(Refusal::WorkerAsCoordinator));
        assert_eq!(decide(Call::Schema, at(W1, 1)), Decision::Refuse(Refusal::WorkerAsCoordinator));
    }

    #[test]
    fn the_coordinator_takes_back_a_shard_a_worker_took() {
        let f = Facts { recorded: W1, ..at(COORDINATOR, 0) };
        assert_eq!(decide(Call::Shard(101), f), Decision::TakeBack { renew: false });
        assert_eq!(decide(Call::Schema, f), Decision::TakeBack { renew: false });
    }

    #[test]
    fn a_release_seen_here_rereads_once_then_acts_on_what_is_new() {
        let released = Facts { released_here: true, ..at(COORDINATOR, 0) };
        assert_eq!(decide(Call::Shard(101), released), Decision::Reread);
        // Read again: the data is elsewhere now, or the release was never recorded.
        let fresh = Facts { fresh: true, ..released };
        assert_eq!(decide(Call::Shard(101), held_by(W1, fresh)), Decision::Send(Node::Holder));
        assert_eq!(decide(Call::Shard(101), fresh), Decision::TakeBack { renew: true });
        // On a worker that took it and was released since.
        let w = Facts { taken_here: true, released_here: true, ..held_by(W1, at(W1, 0)) };
        assert_eq!(decide(Call::Schema, w), Decision::Reread);
        assert_eq!(decide(Call::Schema, Facts { fresh: true, ..w }), Decision::TakeOver);
        assert_eq!(decide(Call::Schema, Facts { fresh: true, ..held_by(W2, w) }), Decision::Send(Node::Holder));
    }

    #[test]
    fn the_decision_never_mints_a_shard_on_two_nodes_at_once() {
        // For each shard and each consistent view of where things are, at
        // most one node answers Here or takes it: its node group, its
        // schema's holder, or the coordinator.
        for shard in [8, 101, 7167, 7168, 8190, 8191] {
            for holder in [None, Some(COORDINATOR), Some(W1), Some(W2)] {
                let minting: Vec<i32> = [COORDINATOR, W1, W2]
                    .into_iter()
                    .filter(|&g| {
                        let f = Facts { holder, taken_here: holder == Some(g), ..at(g, 0) };
                        matches!(decide(Call::Shard(shard), f), Decision::Here | Decision::TakeOver | Decision::TakeBack { .. })
                    })
                    .collect();
                let expected = match node_group_of(shard) {
                    Some(g) if g <= W2 => vec![g],
                    Some(_) => vec![],
                    None => vec![holder.unwrap_or(COORDINATOR)],
                };
                assert_eq!(minting, expected, "shard {shard}, holder {holder:?}");
            }
        }
    }
}
