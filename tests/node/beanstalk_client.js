// A beanstalkd client in a second language (the npm package "beanstalkd") against
// `blizzard beanstalkd`: put, reserve, delete, bury, kick (a buried job, then a delayed one),
// stats. Its argument is a port, or a Unix socket's path (node's net takes a path where a
// port would be). Prints one JSON line of what it saw; tests/test_beanstalkd_node.py runs it
// and checks that line.
import Beanstalkd from "beanstalkd";

const where = process.argv[2];
const port = /^[0-9]+$/.test(where) ? Number(where) : where;
Beanstalkd.default.addCommand("kick", "KICKED"); // in the protocol, not in this client's list
const client = new Beanstalkd.default("127.0.0.1", port);
const seen = {};
try {
  await client.connect();
  await client.use("node-jobs");
  await client.watch("node-jobs");
  await client.ignore("default");
  seen.put = await client.put(5, 0, 60, "from node");
  const [id, body] = await client.reserve();
  seen.reserved = { id, body: body.toString() };
  await client.bury(id, 5);
  seen.kicked = await client.kick(10);
  const [again, body2] = await client.reserveWithTimeout(10);
  seen.again = { id: again, body: body2.toString() };
  await client.delete(again);
  try {
    await client.reserveWithTimeout(0);
    seen.empty = false;
  } catch (err) {
    seen.empty = String(err.message || err).includes("TIMED_OUT");
  }
  const delayed = await client.put(5, 100, 60, "later");
  seen.kickedDelayed = await client.kick(10); // none buried: delayed jobs are kicked
  const [ready, body3] = await client.reserveWithTimeout(10);
  seen.delayedNow = { id: ready, put: delayed, body: body3.toString() };
  await client.delete(ready);
  const stats = await client.stats();
  seen.stats = { puts: stats["cmd-put"], kicks: stats["cmd-kick"], draining: stats.draining };
  seen.tubes = await client.listTubesWatched();
  console.log(JSON.stringify(seen));
  await client.quit();
} catch (err) {
  console.log(JSON.stringify({ error: String(err && err.stack || err), seen }));
  process.exit(1);
}
