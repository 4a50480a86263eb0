"""The dashboard's HTML: pages rendered on the server (``pages``), with one stylesheet and one small
script (``static/``). No build step: what is here is what the browser gets. Served by app/ui/routes/."""
