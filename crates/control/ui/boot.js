// The page's first script: it opens the live stream, then loads the rest of the page.
//
// At 100,000 nodes the control plane takes a while to build the snapshot, and the
// browser a while to fetch and compile the modules: asking for the stream first lets the
// two overlap. Asking first matters: over HTTP/1.1 a browser opens six connections to a
// host, and a stream asked for after the page's scripts and styles waits behind them.
// So the scripts are not in index.html, where the browser's preload scanner would ask for
// them before this runs; they are added here, every module at once (modulepreload) rather
// than level by level as app.js's imports are found.
//
// Messages that come before store.js takes the stream over (`take`) are queued as they
// came, undecoded; from then on they go straight to it. A classic script, not a module,
// so it runs as soon as it arrives.
(() => {
  /** Every event the stream sends; store.js checks that it handles no other. */
  const names = ['snapshot_begin', 'nodes', 'snapshot_end', 'federation', 'app', 'app_removed', 'pool', 'ping'];
  /** Every module app.js imports, directly or not (a test holds this to app.js's imports);
   * the other pages' modules are imported when needed (see app.js). */
  const modules = ['store', 'node-table', 'util', 'api', 'federation', 'heatmap'];

  const queue = [];
  let sink = null;
  const source = new EventSource('/v1/events');
  for (const name of names) {
    source.addEventListener(name, (ev) => {
      const arrived = performance.now();
      if (sink) sink(name, ev.data, arrived);
      else queue.push([name, ev.data, arrived]);
    });
  }
  window.flotillaStream = {
    names,
    source,
    /** Hands the queued messages, then every later one, to fn(name, data, arrived). */
    take(fn) {
      sink = fn;
      for (const [name, data, arrived] of queue.splice(0)) fn(name, data, arrived);
    },
  };

  // EventSource asks for its stream in a task of its own, not in the constructor: the
  // rest is asked for in a later task, so the stream's request goes out first.
  setTimeout(() => {
    const add = (tag, attrs) => document.head.appendChild(Object.assign(document.createElement(tag), attrs));
    for (const m of ['app', ...modules.map((m) => `js/${m}`)]) add('link', { rel: 'modulepreload', href: `/ui/${m}.js` });
    // The modules find the page's elements as they run, so app.js goes in once the body
    // is parsed. (The charts' library is loaded by the first chart: util.js.)
    const start = () => add('script', { type: 'module', src: '/ui/app.js' });
    if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', start, { once: true });
    else start();
  }, 0);
})();
