// API key plaintexts look like "lf-<id>-<secret>"; the id is public and names the key.

/** The key id inside a plaintext key; '' when the key has another format. */
export function keyIdOf(plaintext) {
  const m = /^lf-([A-Za-z0-9]+)-/.exec(plaintext || '');
  return m ? m[1] : '';
}
