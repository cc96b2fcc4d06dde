package web

// The words consent pages share, so both doors describe a client and a
// scope alike.

// ScopeLine is a scope as a consent page lists it: the scope and what it
// lets the app do, in words.
type ScopeLine struct {
	Scope, Words string
	// New: a scope the person's connection does not hold yet (a page
	// asking for more access marks it).
	New bool
}

// UnnamedClient is what a consent page calls a client that gave no name.
const UnnamedClient = "an unnamed client"

// ClientName is the name a consent page shows for the client that asked:
// its self-asserted name (untrusted; the page says so), or UnnamedClient
// when nothing names the requester, neither the client itself nor the
// configured server it came through (server, "" for none).
func ClientName(selfAsserted, server string) string {
	if selfAsserted == "" && server == "" {
		return UnnamedClient
	}
	return selfAsserted
}

// ScopeWords describes the scopes any consent page may show: OpenID
// Connect's and offline_access. ok is false for any other scope, which
// the door describes itself.
func ScopeWords(scope string) (words string, ok bool) {
	switch scope {
	case "openid":
		return "Confirm your identity", true
	case "email":
		return "See your email address", true
	case "profile":
		return "See your basic profile", true
	case "offline_access":
		return "Keep access when you are not using the app", true
	}
	return "", false
}
