// Package version holds the wire protocol's version, so that the agent and
// the coordinator share it without importing each other.
package version

// Protocol is the protocol version agents send in Hello and the coordinator
// answers in Welcome, "MAJOR.MINOR". A coordinator accepts agents of its own
// major whose minor is at most one apart from its own.
const Protocol = "1.0"
