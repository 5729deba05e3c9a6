// `node --import` preload for the Portkey gateway: wrap fetch so upstream responses carry
// mutable headers. Without it `stream: true` answers HTTP 500 ("TypeError: immutable",
// Portkey issues #1389/#1550) because the gateway sets headers on a fetch() Response.
const origFetch = globalThis.fetch;
globalThis.fetch = async function (...args) {
  const r = await origFetch.apply(this, args);
  return new Response(r.body, {
    status: r.status,
    statusText: r.statusText,
    headers: new Headers(r.headers),
  });
};
