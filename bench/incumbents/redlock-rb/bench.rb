# frozen_string_literal: true

# The incumbent for the Ruby client: the redlock gem (Redlock::Client on one Redis server, as its
# README shows), N threads on one client, each locking its own key (lock(key, 10_000): the
# gem's defaults, retries included, never needed on an uncontended key) and unlocking it, again
# and again. 1 s of warm-up, then --seconds counted. Prints {"pairs_per_sec": R, "errors": E};
# exits 1 when more than 1% of the calls failed.
require "optparse"
require "json"
require "redlock"

opts = { addr: "127.0.0.1:6379", callers: 1, seconds: 5.0 }
OptionParser.new do |o|
  o.on("--addr A") { |v| opts[:addr] = v }
  o.on("--callers N", Integer) { |v| opts[:callers] = v }
  o.on("--seconds S", Float) { |v| opts[:seconds] = v }
  o.on("--api API") { |v| raise OptionParser::InvalidArgument, v unless v == "threads" }
end.parse!(ARGV)

client = Redlock::Client.new(["redis://#{opts[:addr]}"])
pairs = Array.new(opts[:callers], 0)
errors = Array.new(opts[:callers], 0)
stop = false
threads = Array.new(opts[:callers]) do |i|
  Thread.new do
    key = "bench-redlock-#{Process.pid}-#{i}"
    until stop
      begin
        info = client.lock(key, 10_000)
        if info
          client.unlock(info)
          pairs[i] += 1
        else
          errors[i] += 1
        end
      rescue StandardError => e
        warn "bench: #{e.class}: #{e.message}" if errors[i].zero?
        errors[i] += 1
      end
    end
  end
end
sleep 1
p0 = pairs.sum
e0 = errors.sum
t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
sleep opts[:seconds]
p1 = pairs.sum
e1 = errors.sum
took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
stop = true
threads.each { |t| t.join(10) }
n = p1 - p0
errs = e1 - e0
puts JSON.generate({ pairs_per_sec: (n / took).round(1), errors: errs })
exit(errs * 100 > n + errs ? 1 : 0)
