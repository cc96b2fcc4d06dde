package replicache

import (
	"testing"
	"time"
)

// TestTrust: a fed cache answers and fills only while its feed was
// current within Bound; before the first Fresh, after Reset, and once
// the last Fresh is older than Bound it answers nothing and takes
// nothing. A sole writer's cache is always trusted.
func TestTrust(t *testing.T) {
	c := New[int](0, 10, false)
	if _, _, epoch, ok := c.Get("k"); ok || epoch != 0 {
		t.Fatalf("before any Fresh: ok %v, epoch %d; want neither", ok, epoch)
	}
	c.Put(1, "k", "g", 1)
	// Fresh as of an hour ahead: what follows must not count on running
	// within Bound (1 s) of it on a busy machine.
	c.Fresh(time.Now().Add(time.Hour))
	if _, _, _, ok := c.Get("k"); ok {
		t.Fatal("a fill made while the cache was not trusted was kept")
	}
	_, _, epoch, _ := c.Get("k")
	c.Put(epoch, "k", "g", 7)
	if v, g, _, ok := c.Get("k"); !ok || v != 7 || g != "g" {
		t.Fatalf("Get = %v, %q, %v; want 7 in g", v, g, ok)
	}
	c.Fresh(time.Now().Add(-Bound - time.Millisecond)) // older than the last: ignored
	if _, _, _, ok := c.Get("k"); !ok {
		t.Fatal("an older Fresh moved the cache's freshness back")
	}
	c.Reset()
	if _, _, _, ok := c.Get("k"); ok {
		t.Fatal("answered after Reset")
	}
	c.Fresh(time.Now().Add(-Bound - time.Millisecond)) // the feed's last word is too old
	if _, _, epoch, ok := c.Get("k"); ok || epoch != 0 {
		t.Fatalf("feed current only as of more than Bound ago: ok %v, epoch %d", ok, epoch)
	}

	sole := New[int](0, 10, true)
	_, _, epoch, _ = sole.Get("k")
	sole.Put(epoch, "k", "g", 3)
	if v, _, _, ok := sole.Get("k"); !ok || v != 3 {
		t.Fatal("a sole writer's cache is not trusted")
	}
}

// TestDropRacesFill: Drop forgets every value of its group and no other;
// a fill that read the store before a Drop (its epoch is older) is not
// kept, whatever group it is for.
func TestDropRacesFill(t *testing.T) {
	c := New[string](0, 10, false)
	c.Fresh(time.Now().Add(time.Hour))
	_, _, epoch, _ := c.Get("f1")
	c.Put(epoch, "f1", "app1", "a")
	c.Put(epoch, "f2", "app1", "b")
	c.Put(epoch, "f3", "app2", "c")
	_, _, stale, _ := c.Get("f4")
	c.Drop("app1")
	for _, k := range []string{"f1", "f2"} {
		if _, _, _, ok := c.Get(k); ok {
			t.Fatalf("%s of the dropped group is still cached", k)
		}
	}
	if v, _, _, ok := c.Get("f3"); !ok || v != "c" {
		t.Fatal("Drop of app1 forgot app2's value")
	}
	c.Put(stale, "f4", "app3", "stale")
	if _, _, _, ok := c.Get("f4"); ok {
		t.Fatal("a fill that started before a Drop was kept")
	}
}

// TestMax: the cache holds at most max values, and evicting one keeps
// its group's index true (a later Drop of the group works).
func TestMax(t *testing.T) {
	c := New[int](2, 10, true)
	_, _, epoch, _ := c.Get("")
	for i, k := range []string{"a", "b", "c"} {
		c.Put(epoch, k, "g", i)
	}
	n := 0
	for _, k := range []string{"a", "b", "c"} {
		if _, _, _, ok := c.Get(k); ok {
			n++
		}
	}
	if n != 2 || len(c.groups["g"]) != 2 {
		t.Fatalf("holds %d values, group index %v; want 2", n, c.groups["g"])
	}
	c.Drop("g")
	if len(c.vals) != 0 || len(c.groups) != 0 {
		t.Fatalf("after Drop: %v, %v", c.vals, c.groups)
	}
}
