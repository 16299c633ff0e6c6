-- bench/programs/store.sql - SQLite in memory, run by bench/programs.py.
--
-- Usage: sqlite3 -bail :memory: ".parameter set @n ROWS" ".read store.sql". The shape of an
-- application's embedded database: customers and orders inserted row by row by recursive queries,
-- three indexes built, then a group-by, a join, an update that rewrites text and a delete, each
-- leaving the B-trees' pages and the page cache's blocks (a little over 4 KB each, from malloc for
-- an in-memory database) to be freed and reused. Deterministic: prints counts and sums, the same
-- under every allocator.
CREATE TABLE customers(id INTEGER PRIMARY KEY, name TEXT, city TEXT, tier INTEGER);
CREATE TABLE orders(id INTEGER PRIMARY KEY, customer INTEGER, sku TEXT, qty INTEGER, price REAL,
                    note TEXT);
BEGIN;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < @n / 10)
INSERT INTO customers
  SELECT x, printf('customer-%06d', (x * 7919) % 1000003), printf('city-%03d', x % 211), x % 5 FROM c;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < @n)
INSERT INTO orders
  SELECT x, 1 + (x * 104729) % (@n / 10), printf('SKU-%05d', (x * 13) % 9973), 1 + x % 7,
         ((x * 37) % 4000) / 4.0,
         substr('lorem ipsum dolor sit amet consectetur adipiscing elit', 1 + x % 20, 10 + x % 30)
  FROM c;
COMMIT;
CREATE INDEX orders_customer ON orders(customer);
CREATE INDEX orders_sku ON orders(sku, qty);
CREATE INDEX customers_city ON customers(city, name);
SELECT 'groups', count(*), sum(n), printf('%.2f', sum(total)) FROM
  (SELECT sku, count(*) AS n, sum(qty * price) AS total FROM orders GROUP BY sku HAVING n > 1);
SELECT 'join', count(*), printf('%.2f', sum(o.qty * o.price)), max(c.name)
  FROM orders o JOIN customers c ON c.id = o.customer
  WHERE c.city < 'city-100' AND c.tier IN (1, 3);
BEGIN;
UPDATE orders SET note = upper(note) || ' / ' || sku, qty = qty + 1 WHERE id % 3 = 0;
DELETE FROM orders WHERE customer % 7 = 2;
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < @n / 4)
INSERT INTO orders(customer, sku, qty, price, note)
  SELECT 1 + x % (@n / 10), printf('NEW-%05d', x % 977), 1, x / 8.0, 'added' FROM c;
COMMIT;
SELECT 'after', count(*), sum(qty), sum(length(note)), count(DISTINCT sku) FROM orders;
SELECT 'cities', count(*), sum(n) FROM
  (SELECT c.city, count(*) AS n FROM customers c JOIN orders o ON o.customer = c.id GROUP BY c.city);
