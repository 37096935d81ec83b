package settings

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOperationsDocListsEverySetting keeps docs/operations.md's settings table and the binary's
// settings (Table, the list that Parse reads) equal: every setting is documented with its
// default, and the table names nothing the binary does not accept.
func TestOperationsDocListsEverySetting(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{} // variable -> default cell
	row := regexp.MustCompile("(?m)^\\| (`TICKETING_[^|]+) \\|([^|]*)\\|")
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		for _, v := range regexp.MustCompile("`(TICKETING_[A-Z_]+)`").FindAllStringSubmatch(m[1], -1) {
			rows[v[1]] = strings.TrimSpace(m[2])
		}
	}
	known := map[string]bool{"TICKETING_TOKEN": true, "TICKETING_ADMIN_TOKEN": true, "TICKETING_CLUSTER_SECRET": true}
	for _, st := range Table() {
		name := EnvName(st.Name)
		known[name] = true
		cell, ok := rows[name]
		if !ok {
			t.Errorf("%s (--%s) is not in docs/operations.md", name, st.Name)
			continue
		}
		if st.Default != "" && st.Name != "data-dir" && !strings.Contains(cell, "`"+st.Default+"`") {
			t.Errorf("%s: docs say default %q, the binary %q", name, cell, st.Default)
		}
	}
	for name := range rows {
		if !known[name] {
			t.Errorf("docs/operations.md lists %s, which the binary does not accept", name)
		}
	}
}
