module Redlock
  VERSION = '1.3.2'
end
