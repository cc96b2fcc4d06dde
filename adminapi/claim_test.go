package adminapi

import "testing"

func TestClaim(t *testing.T) {
	for _, bad := range []string{"", "groups", "=x", "groups=", "a..b=x", ".a=x", "a b=x"} {
		if _, err := ParseClaim(bad); err == nil {
			t.Errorf("ParseClaim(%q) accepted", bad)
		}
	}
	groups, _ := ParseClaim("groups=credbroker-admins")
	roles, _ := ParseClaim("realm_access.roles=admin")
	for _, tt := range []struct {
		c      Claim
		claims string
		want   bool
	}{
		{groups, `{"groups":["eng","credbroker-admins"]}`, true},
		{groups, `{"groups":"credbroker-admins"}`, true},
		{groups, `{"groups":"eng credbroker-admins"}`, true},
		{groups, `{"groups":["eng"]}`, false},
		{groups, `{"groups":"credbroker-admins-not"}`, false},
		{groups, `{"sub":"alice"}`, false},
		{groups, `{"groups":{"credbroker-admins":true}}`, false},
		{roles, `{"realm_access":{"roles":["admin"]}}`, true},
		{roles, `{"realm_access":["admin"]}`, false},
		{groups, `not json`, false},
	} {
		if got := tt.c.Holds([]byte(tt.claims)); got != tt.want {
			t.Errorf("%s on %s = %v, want %v", tt.c, tt.claims, got, tt.want)
		}
	}
}
