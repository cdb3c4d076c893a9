// Package membership runs fleetcheck's gossip pool: agents and the coordinator
// join one hashicorp/memberlist cluster, carry a small node meta (role, labels,
// versions) and learn within seconds when a member stops answering.
//
// # Gossip is a liveness hint only
//
// A member reported dead by gossip may be a dead node, a partitioned one, or a
// node whose UDP is being dropped while its gRPC stream is fine. Consumers may
// therefore mark a node "unreachable" (and clear it on NodeJoined), but they must
// never drain a node, decide a check result, or advance, pause or fail a
// campaign from a membership event. Only results and the agent stream decide.
//
// # Addresses
//
// Config.BindAddr has no default: production sets the node's data-plane
// address explicitly, and a bind to an unspecified address (0.0.0.0, ::)
// requires an explicit AdvertiseAddr, so memberlist never picks an address by
// itself. Tests and the demo use LoopbackConfig, which binds and advertises
// 127.0.0.1.
//
// # Rejoin
//
// memberlist does not merge two sides of a partition that lasted longer than
// the suspicion timeout: each side holds the other as dead and stops probing
// it. Every RejoinInterval a Pool therefore re-joins those of its seed
// addresses (Config.Join and addresses given to Join, typically the
// coordinator) that are not alive members, and the last known address of one
// randomly chosen dead member. Both are rationed so that the whole pool, not
// each member, makes a few attempts per interval: a join is a full state
// exchange, and ten thousand agents rejoining a coordinator that just came
// back would bury it. In steady state (seeds alive, nobody dead) nothing
// extra is sent.
//
// # Wiring
//
// Coordinator: New with Meta.Role = RoleCoordinator and no seeds. On
// NodeLeft with StateDead mark the node unreachable (a hint for operators;
// the agent stream and results still decide everything else); on StateLeft
// note a clean stop; on NodeJoined clear unreachable; on NodeUpdated refresh the
// labels and versions the member declares. Events about members whose Meta
// role is not RoleAgent, and about the coordinator itself, need no action.
//
// Agent: New with Meta.Role = RoleAgent, its labels and versions, and Join
// set to the coordinator's gossip address; there is no need to call Join. Call
// UpdateMeta when its labels change, Leave then Shutdown on a clean stop, and
// the key operations when the coordinator asks for a rotation.
//
// # Key rotation
//
// A member decrypts with every installed key and encrypts with the primary
// one. A pool-wide rotation therefore runs in three rounds, each finished on
// every member before the next starts (the coordinator drives it over its
// agent streams):
//
//  1. InstallKey(new) on every member: all can now read both keys.
//  2. UseKey(new) on every member: senders switch; receivers still read old.
//  3. RemoveKey(old) on every member.
//
// A member that misses round 1 stops hearing its peers in round 2 and is
// declared dead; install the key on it and it rejoins through the rejoin
// loop. Encryption must be enabled at start (a non-empty Config.Keyring):
// memberlist cannot switch a running plaintext pool to encrypted.
package membership
