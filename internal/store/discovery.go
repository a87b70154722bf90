package store

// The statements of discovery within a server (sql/discovery.sql), sent by package
// targets at start and at each re-check.
var (
	DiscoverDatabases = Statement{"discover_databases"}
	DiscoverSource    = Statement{"discover_source"}
)

// This adds the statements above to handles. A package-level variable that
// reads handles is initialized after it and before any init function, so the check in
// statements.go's init sees them; statements.go itself stays as it is.
var _ = func() bool {
	handles = append(handles, DiscoverDatabases.name, DiscoverSource.name)
	return true
}()

// InstancesTable is the source's instances table as a quoted identifier, for
// DiscoverSource's argument.
func (s *Source) InstancesTable() string {
	if s.Kind() == SourceWhizbang {
		return s.orDefault().cfg.Whizbang.table().Quoted()
	}
	return Table{Schema: s.Schema(), Name: "instances"}.Quoted()
}
