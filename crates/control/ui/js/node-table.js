// The nodes the stream sent, kept as columns: one array per field of a node's row (the
// indexes are `N`), and a slot per node into all of them.
//
// At 100,000 nodes a row per node (an array of 16 values) was the largest part of
// applying a snapshot, and the garbage collector's work on the way to the first paint.
// A column takes one store per node and field. Code that wants one node's row still gets
// an array (`get`, built when asked); the heatmap and the nodes table read the columns
// by slot.
//
// A node keeps its slot until it is removed; the slot then stays empty (its id
// undefined) so that whoever laid nodes out by slot stays right. When more slots are
// empty than used, `compact` moves the nodes together and bumps `epoch`: a layout by
// slot made under another epoch must be made again.

/** Indexes into a node's row and into the table's columns. */
export const N = Object.freeze({
  ID: 0, STATUS: 1, SHARD: 2, DOMAIN: 3, PRIORITY: 4, HEALTH: 5,
  CPU_CAP: 6, CPU_ALLOC: 7, MEM_CAP: 8, MEM_ALLOC: 9, GPU_CAP: 10, GPU_ALLOC: 11,
  CORDONED: 12, DRAIN: 13, INCARNATION: 14, PREEMPTING: 15,
});
const FIELDS = 16;

/** Empty slots tolerated before a compaction, whatever the table's size. */
const MIN_HOLES = 1024;

export class NodeTable {
  constructor() {
    /** cols[N.X][slot]; cols[N.ID][slot] is undefined for an empty slot. */
    this.cols = Array.from({ length: FIELDS }, () => []);
    /** node id → slot, in the order the nodes first came. */
    this.slots = new Map();
    this.holes = 0;
    this.epoch = 0;
    /** No id in the table is greater (ids only ever added here): a snapshot's ids come
     * in order, so most of its nodes are known to be new without a look-up that misses
     * in a map of 100,000. */
    this.maxId = '';
  }

  get size() { return this.slots.size; }

  /** Slots in use, one past the last (a loop bound over the columns). */
  get end() { return this.cols[N.ID].length; }

  slotOf(id) { return id > this.maxId ? undefined : this.slots.get(id); }

  has(id) { return this.slots.has(id); }

  keys() { return this.slots.keys(); }

  /** A new slot at the end for `id`, which has none. */
  add(id) {
    const s = this.cols[N.ID].length;
    this.cols[N.ID][s] = id;
    this.slots.set(id, s);
    if (id > this.maxId) this.maxId = id;
    return s;
  }

  /** A new array with the node's fields (see N), or undefined. */
  get(id) {
    const s = this.slots.get(id);
    return s === undefined ? undefined : this.row(s);
  }

  row(slot) {
    const r = new Array(FIELDS);
    for (let k = 0; k < FIELDS; k++) r[k] = this.cols[k][slot];
    return r;
  }

  /** Removes a node; false if it was not here. */
  delete(id) {
    const s = this.slots.get(id);
    if (s === undefined) return false;
    this.slots.delete(id);
    for (let k = 0; k < FIELDS; k++) this.cols[k][s] = undefined;
    this.holes += 1;
    return true;
  }

  /** Whether enough slots are empty that `compact` is worth it. */
  sparse() { return this.holes > MIN_HOLES && this.holes > this.slots.size; }

  /** Moves the nodes into the first slots, in slot order, and bumps `epoch`. */
  compact() {
    const old = this.cols;
    const cols = Array.from({ length: FIELDS }, () => []);
    let n = 0;
    for (let s = 0; s < old[N.ID].length; s++) {
      const id = old[N.ID][s];
      if (id === undefined) continue;
      for (let k = 0; k < FIELDS; k++) cols[k][n] = old[k][s];
      this.slots.set(id, n);
      n += 1;
    }
    this.cols = cols;
    this.holes = 0;
    this.epoch += 1;
  }
}
