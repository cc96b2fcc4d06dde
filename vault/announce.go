package vault

import "context"

// ConnectionWrites is told of the writes of connections made through a
// store Announced returns, after each returns.
type ConnectionWrites interface {
	// Changed: one of p's connections may have changed.
	Changed(p Principal)
	// ChangedAll: some connection may have changed, whose person is not
	// known here (a delete by id, a failed write, a reseal).
	ChangedAll()
}

// Announced returns s with every write of a connection (create, update,
// delete, connect, retire, reseal) reported to w after it returns, for a
// process that is the store's only writer and caches what it read (the
// connections core's listing cache). Every other operation is s's.
func Announced(s Store, w ConnectionWrites) Store {
	a := &announced{Store: s, w: w}
	a.connector = feature(s.Connector(), func(f GrantConnector) GrantConnector { return announcedConnector{f, w} })
	a.admin = feature(s.Admin(), func(f AdminStore) AdminStore { return announcedAdmin{f, w} })
	a.resealer = feature(s.Resealer(), func(f Resealer) Resealer { return announcedResealer{f, w} })
	return a
}

type announced struct {
	Store
	w         ConnectionWrites
	connector GrantConnector
	admin     AdminStore
	resealer  Resealer
}

func (a *announced) Connector() GrantConnector { return a.connector }
func (a *announced) Admin() AdminStore         { return a.admin }
func (a *announced) Resealer() Resealer        { return a.resealer }

// wrote reports a write of c that returned err.
func wrote(w ConnectionWrites, p Principal, err error) {
	if err != nil {
		w.ChangedAll()
		return
	}
	w.Changed(p)
}

func (a *announced) CreateConnection(ctx context.Context, c Connection) (Connection, error) {
	r, err := a.Store.CreateConnection(ctx, c)
	wrote(a.w, c.Principal, err)
	return r, err
}

func (a *announced) UpdateConnection(ctx context.Context, id string, fn func(Connection) (Connection, error)) (Connection, error) {
	r, err := a.Store.UpdateConnection(ctx, id, fn)
	wrote(a.w, r.Principal, err)
	return r, err
}

func (a *announced) UpdateConnectionMeta(ctx context.Context, id string, fn func(Connection) (Connection, error)) (Connection, error) {
	r, err := a.Store.UpdateConnectionMeta(ctx, id, fn)
	wrote(a.w, r.Principal, err)
	return r, err
}

func (a *announced) DeleteConnection(ctx context.Context, id string) error {
	defer a.w.ChangedAll()
	return a.Store.DeleteConnection(ctx, id)
}

type announcedConnector struct {
	next GrantConnector
	w    ConnectionWrites
}

func (c announcedConnector) Connect(ctx context.Context, cw ConnectionWrite, grantID string, grant func(Grant) (Grant, error)) (Connection, Grant, error) {
	conn, g, err := c.next.Connect(ctx, cw, grantID, grant)
	wrote(c.w, conn.Principal, err)
	return conn, g, err
}

type announcedAdmin struct {
	AdminStore
	w ConnectionWrites
}

func (a announcedAdmin) RetireConnection(ctx context.Context, id string) error {
	defer a.w.ChangedAll()
	return a.AdminStore.RetireConnection(ctx, id)
}

type announcedResealer struct {
	next Resealer
	w    ConnectionWrites
}

func (r announcedResealer) Reseal(ctx context.Context, ids []string) (int, error) {
	defer r.w.ChangedAll()
	return r.next.Reseal(ctx, ids)
}
