package collector

import (
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// rowScanner scans every row of one statement into the same T, by column name, with
// the rules of pgx.RowToStructByName (a field per column by its db tag, embedded
// structs' fields included, no column or field left over). RowToStructByName builds its
// list of targets again and returns a new T for each row: at the budget's scale that was
// two thousand allocations a scrape in the instances and leases collectors, a third of
// all. The row is overwritten by the next scan, so a caller copies out what it keeps.
type rowScanner[T any] struct {
	row     T
	targets []any
	columns []string // the columns targets were matched to
}

// scan reads the current row into the scanner's T and returns it.
func (s *rowScanner[T]) scan(rows pgx.Rows) (*T, error) {
	fds := rows.FieldDescriptions()
	same := len(fds) == len(s.columns) && s.targets != nil
	for i := 0; same && i < len(fds); i++ {
		same = fds[i].Name == s.columns[i]
	}
	if !same {
		if err := s.match(fds); err != nil {
			return nil, err
		}
	}
	if err := rows.Scan(s.targets...); err != nil {
		return nil, err
	}
	return &s.row, nil
}

// match points each column at the field of T that its db tag names.
func (s *rowScanner[T]) match(fds []pgconn.FieldDescription) error {
	fields := map[string]any{}
	var walk func(v reflect.Value)
	walk = func(v reflect.Value) {
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.Anonymous && f.Type.Kind() == reflect.Struct {
				walk(v.Field(i))
				continue
			}
			if name := f.Tag.Get("db"); name != "" && name != "-" && f.IsExported() {
				fields[name] = v.Field(i).Addr().Interface()
			}
		}
	}
	walk(reflect.ValueOf(&s.row).Elem())
	s.targets, s.columns = make([]any, len(fds)), make([]string, len(fds))
	for i, fd := range fds {
		t, ok := fields[fd.Name]
		if !ok {
			s.targets = nil
			return fmt.Errorf("column %q has no field in %T", fd.Name, s.row)
		}
		s.targets[i], s.columns[i] = t, fd.Name
		delete(fields, fd.Name)
	}
	for name := range fields {
		s.targets = nil
		return fmt.Errorf("field %q of %T has no column", name, s.row)
	}
	return nil
}
