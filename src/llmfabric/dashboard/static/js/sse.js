// Incremental parser for text/event-stream bodies (the OpenAI streaming format).

/**
 * Feed decoded text chunks with push(); it returns the complete events seen so far as
 * {event, data} objects (data lines joined by "\n"). Handles \n, \r\n and \r line ends and
 * events split across chunks at any byte.
 */
export class SseParser {
  constructor() {
    this.buffer = '';
    this.data = [];
    this.event = '';
  }

  push(text) {
    this.buffer += text;
    const out = [];
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buffer);
      if (!m) break;
      // a lone "\r" at the very end may be the first half of "\r\n": wait for more
      if (m[0] === '\r' && m.index === this.buffer.length - 1) break;
      const line = this.buffer.slice(0, m.index);
      this.buffer = this.buffer.slice(m.index + m[0].length);
      this.line(line, out);
    }
    return out;
  }

  /** Flush at end of stream: a final event without its blank line still counts. */
  end() {
    const out = [];
    // a trailing lone "\r" was held back in case "\n" followed; at the end it is a line end
    const rest = this.buffer.endsWith('\r') ? this.buffer.slice(0, -1) : this.buffer;
    if (rest) this.line(rest, out);
    this.buffer = '';
    this.line('', out);
    return out;
  }

  line(line, out) {
    if (line === '') {
      if (this.data.length) out.push({ event: this.event || 'message', data: this.data.join('\n') });
      this.data = [];
      this.event = '';
      return;
    }
    if (line.startsWith(':')) return;
    const i = line.indexOf(':');
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? '' : line.slice(i + 1);
    if (value.startsWith(' ')) value = value.slice(1);
    if (field === 'data') this.data.push(value);
    else if (field === 'event') this.event = value;
  }
}

/**
 * Read an OpenAI chat-completions stream from a fetch Response and call
 * onDelta(text, chunk) for every content delta; resolves to {text, usage, finishReason}.
 */
export async function readChatStream(resp, onDelta) {
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  const parser = new SseParser();
  let text = '';
  let usage = null;
  let finishReason = null;
  let done = false;
  const handle = (events) => {
    for (const ev of events) {
      if (ev.data === '[DONE]') { done = true; continue; }
      let chunk;
      try { chunk = JSON.parse(ev.data); } catch { continue; }
      if (chunk.error) {
        const msg = typeof chunk.error === 'string' ? chunk.error : chunk.error.message;
        throw new Error(msg || 'the stream reported an error');
      }
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = (choice.delta && choice.delta.content) || choice.text || '';
        if (delta) { text += delta; onDelta(delta, chunk); }
        if (choice.finish_reason) finishReason = choice.finish_reason;
      }
    }
  };
  while (!done) {
    const { value, done: eof } = await reader.read();
    if (eof) { handle(parser.push(decoder.decode())); handle(parser.end()); break; }
    handle(parser.push(decoder.decode(value, { stream: true })));
  }
  if (done) reader.cancel().catch(() => {});
  return { text, usage, finishReason };
}
