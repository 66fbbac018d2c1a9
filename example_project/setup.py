# The egg scrapyd deploys (scrapyd-deploy builds it). Eggs carry no dependencies: install
# scrapy-ha in scrapyd's own environment.
from setuptools import find_packages, setup

setup(
    name="catalogue",
    version="1.0",
    packages=find_packages(),
    entry_points={"scrapy": ["settings = catalogue.settings"]},
)
