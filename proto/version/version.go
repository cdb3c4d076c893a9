// Package version holds the wire protocol's version, so that the agent and
// the coordinator share it without importing each other.
package version

// Protocol is the protocol version agents send in Hello and the coordinator
// answers in Welcome, "MAJOR.MINOR". A coordinator accepts agents of its own
// major whose minor is at most one apart from its own.
//
// 1.1 added RunChecks params and multi-node roles, RunAction/ActionStatus
// and EndMulti. A 1.0 agent would ignore the roles and params and run a
// plain single-node check instead, so a coordinator sends these only to
// agents that said 1.1 or later (MinorAtLeast).
const Protocol = "1.1"

// Features1_1 is the first version with params, multi-node roles and actions.
const Features1_1 = "1.1"
