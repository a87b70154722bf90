package collector

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pg-liveness/pg_liveness_exporter/internal/testkit/pgtest"
)

type scanInner struct {
	B pgtype.Int8 `db:"b"`
}

type scanRow struct {
	A pgtype.Text `db:"a"`
	C *int64      `db:"c"` // as store.StatStatementsRow's: nil for NULL
	scanInner
}

// The reused row reads what RowToStructByName reads, row by row: a NULL after a value
// leaves the field invalid rather than keeping the earlier row's value; and the same
// mismatches are refused.
func TestRowScannerReadsAsRowToStructByName(t *testing.T) {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgtest.NewDB(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	const sql = `SELECT * FROM (VALUES ('x', 1::bigint, 7::bigint), (NULL, NULL, NULL), ('z', 3, 9)) v(a, b, c)`
	want, err := pgx.CollectRows(must(conn.Query(ctx, sql)), pgx.RowToStructByName[scanRow])
	if err != nil {
		t.Fatal(err)
	}
	rows := must(conn.Query(ctx, sql))
	var sc rowScanner[scanRow]
	var got []scanRow
	for rows.Next() {
		r, err := sc.scan(rows)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, *r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) || len(got) != 3 || got[1].A.Valid || got[1].B.Valid || got[1].C != nil || *got[0].C != 7 {
		t.Fatalf("got %+v, want %+v", got, want)
	}

	for sql, msg := range map[string]string{
		`SELECT 'x' AS a, 1::bigint AS b, 2::bigint AS c, 3 AS d`: `column "d" has no field`,
		`SELECT 'x' AS a, 2::bigint AS c`:                         `field "b" of collector.scanRow has no column`,
	} {
		rows := must(conn.Query(ctx, sql))
		var sc rowScanner[scanRow]
		rows.Next()
		_, err := sc.scan(rows)
		rows.Close()
		if err == nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: %v; want %q", sql, err, msg)
		}
		if _, err := pgx.CollectRows(must(conn.Query(ctx, sql)), pgx.RowToStructByName[scanRow]); err == nil {
			t.Errorf("%s: RowToStructByName accepts it", sql)
		}
	}
}

func must(rows pgx.Rows, err error) pgx.Rows {
	if err != nil {
		panic(err)
	}
	return rows
}
