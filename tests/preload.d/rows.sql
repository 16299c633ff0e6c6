-- rows.sql - an SQLite workload for tests/preload (sqlite3 DATABASE < rows.sql): 60k rows made by a
-- recursive CTE, indexes, aggregates, updates, deletes, a blob table with rows above 1 MB, vacuum.
-- Every query orders its rows, so the output depends only on the data.
PRAGMA cache_size = -8000;
CREATE TABLE item (id INTEGER PRIMARY KEY, grp INTEGER, name TEXT, price REAL, note TEXT);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 60000)
INSERT INTO item (id, grp, name, price, note)
  SELECT i, (i * 7919) % 97, printf('item-%06d', (i * 104729) % 60000), ((i * 31) % 1000) / 10.0,
         substr(hex(zeroblob(1 + i % 120)), 1, 1 + (i * 13) % 200)
  FROM n;
CREATE INDEX item_grp ON item (grp, price);
CREATE INDEX item_name ON item (name);
SELECT count(*), sum(grp), round(sum(price), 1), sum(length(note)) FROM item;
SELECT grp, count(*), round(avg(price), 3), min(name), max(name) FROM item GROUP BY grp ORDER BY grp LIMIT 12;
SELECT name, price FROM item WHERE name BETWEEN 'item-001000' AND 'item-001010' ORDER BY name;
SELECT grp, group_concat(id, ',') FROM (SELECT grp, id FROM item WHERE grp < 3 AND price > 99 ORDER BY id)
  GROUP BY grp ORDER BY grp;

CREATE TABLE tag (item_id INTEGER REFERENCES item (id), tag TEXT);
INSERT INTO tag SELECT id, 'tag' || (id % 17) FROM item WHERE id % 3 = 0;
INSERT INTO tag SELECT id, 'tag' || (id % 5) FROM item WHERE id % 5 = 0;
CREATE INDEX tag_tag ON tag (tag, item_id);
SELECT t.tag, count(*), round(sum(i.price), 1) FROM tag t JOIN item i ON i.id = t.item_id
  GROUP BY t.tag ORDER BY count(*) DESC, t.tag LIMIT 10;

UPDATE item SET note = note || note || note, price = price * 2 WHERE grp % 4 = 1;
DELETE FROM item WHERE id % 3 = 2;
DELETE FROM tag WHERE item_id NOT IN (SELECT id FROM item);
SELECT count(*), round(sum(price), 1), sum(length(note)) FROM item;
SELECT count(*) FROM tag;

CREATE TABLE big (id INTEGER PRIMARY KEY, data BLOB);
WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 24)
INSERT INTO big SELECT i, zeroblob(i * 100000) FROM n;
UPDATE big SET data = data || x'ff' WHERE id % 2 = 0;
SELECT count(*), sum(length(data)), max(length(data)) FROM big;
DELETE FROM big WHERE id > 12;

VACUUM;
PRAGMA integrity_check;
SELECT count(*), sum(grp), round(sum(price), 1) FROM item;
SELECT name, grp, price FROM item ORDER BY price DESC, name LIMIT 5;
WITH ranked AS (SELECT grp, name, row_number() OVER (PARTITION BY grp ORDER BY price DESC, name) AS r FROM item)
  SELECT grp, name FROM ranked WHERE r = 1 ORDER BY grp LIMIT 8;
