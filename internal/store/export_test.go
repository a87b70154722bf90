package store

// VerdictsQuery is a source's verdict as a statement of its own (every instance's id,
// state, alive, lock_held and key_shared), for the tests of the verdict itself; the
// product reads it only inside its statements.
func VerdictsQuery(src *Source) Query {
	s := &section{name: "test_verdicts", kind: kindStatement,
		body: "SELECT v.instance_id, v.state, v.alive, v.lock_held, v.key_shared FROM {verdicts} v"}
	src = src.orDefault()
	return render(s, string(src.cfg.Kind), src.vals)
}
