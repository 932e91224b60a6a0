package zkqueue

// SetCatalogListedHook sets the function c's deletions run after each
// listing of a node's children, before deleting them (tests stage a
// concurrent writer there); nil removes it.
func SetCatalogListedHook(c *Catalog, f func(p string)) { c.listed = f }
