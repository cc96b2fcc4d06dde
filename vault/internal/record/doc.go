// Package record holds the stored forms of the vault's records and the
// rules every backend applies when it writes them, so the backends under
// vault/ share one codec and the formats stay out of vault's public API:
//
//   - connections: format 2 (format2.go: binary, with an extension area
//     that lets the record grow; the token set sealed with the key ring,
//     its additional data bound to the record's identity) is written,
//     format 1 (JSON) is still read; metadata reads open nothing;
//   - grants (JSON, with a reflection-free fast path: grantparse.go), the
//     authorization server's clients, codes and app access records,
//     webhook deliveries, and spent assertions as exported (assertion.go);
//   - the update rules of the compare-and-swap closures (immutable fields,
//     versions: Kind.Apply), and Kind, which bundles a kind's codec and
//     rules for a backend's one compare-and-swap helper.
package record
